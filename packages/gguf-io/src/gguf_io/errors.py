"""The one exception type that gguf-io lets escape for malformed input."""

from __future__ import annotations

__all__ = ["GGUFError"]


class GGUFError(ValueError):
    """A GGUF file (or a request to write one) is malformed, truncated, unsafe or unreadable.

    The message names the file, the offending field and what was expected, so that a user can act on it.
    """
