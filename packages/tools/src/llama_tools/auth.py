"""The API-key check llama-server and llama-router share (`--api-key`, `--api-key-file`), and the scope a
key gives the resumable streams created under it."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping

__all__ = ["api_key_ok", "key_scope", "presented_key"]


def presented_key(headers: Mapping[str, str]) -> str:
    """The key a request presents: `Authorization: Bearer KEY`, else `x-api-key` ("" for none)."""
    key = headers.get("authorization") or headers.get("x-api-key") or ""
    return key[7:] if key.startswith("Bearer ") else key


def api_key_ok(keys: Iterable[bytes], headers: Mapping[str, str]) -> bool:
    """Whether the request's `Authorization: Bearer KEY` (or `x-api-key`) is one of `keys`."""
    given = presented_key(headers).encode("latin-1", "replace")
    ok = False
    for k in keys:  # compare with every key: the time taken does not tell which one matched
        ok |= hmac.compare_digest(given, k)
    return ok


def key_scope(keys: Iterable[str | bytes], headers: Mapping[str, str]) -> str:
    """Whose a resumable stream is: "" without API keys (everyone's, as llama.cpp), else a digest of the key
    the (already authenticated) request presented, so a stream created under one key cannot be looked up,
    replayed or stopped with another. The digest, not the key, is what the session keeps."""
    if not any(True for _ in keys):
        return ""
    given = presented_key(headers).encode("latin-1", "replace")
    return hashlib.sha256(b"llama-stream-scope\0" + given).hexdigest()[:32]
