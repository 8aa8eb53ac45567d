"""The chat web UI served by `llama-server` at `/`: the built files of the SvelteKit app in this folder.

The app's source (TypeScript, Svelte) lives beside this package; its build output is committed under
`static/`, so installing the package needs no Node.js.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["static_dir"]
__version__ = "0.1.0"


def static_dir() -> Path:
    """The folder holding `index.html` and the hashed `_app/` assets."""
    return Path(__file__).parent / "static"
