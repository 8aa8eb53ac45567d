"""The API-key check llama-server and llama-router share (`--api-key`, `--api-key-file`)."""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping

__all__ = ["api_key_ok"]


def api_key_ok(keys: Iterable[bytes], headers: Mapping[str, str]) -> bool:
    """Whether the request's `Authorization: Bearer KEY` (or `x-api-key`) is one of `keys`."""
    key = headers.get("authorization") or headers.get("x-api-key") or ""
    if key.startswith("Bearer "):
        key = key[7:]
    given = key.encode("latin-1", "replace")
    ok = False
    for k in keys:  # compare with every key: the time taken does not tell which one matched
        ok |= hmac.compare_digest(given, k)
    return ok
