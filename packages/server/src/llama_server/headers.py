"""Response header names in canonical case (`Access-Control-Allow-Origin`, `Content-Type`), as llama-server
sends them.

HTTP says header names are case-insensitive, but clients that copy headers into a plain dictionary (Python's
`dict(response.headers)`, JavaScript objects) look them up case-sensitively, and Litestar and the edge
middleware write them in lower case. `CanonicalHeaders` rewrites each name of `http.response.start` once: a
dictionary lookup per header, filled on first sight of a name.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CanonicalHeaders", "canonical_name"]

# names whose usual spelling is not plain Title-Case of their dash-separated words
_SPECIAL = {
    b"www-authenticate": b"WWW-Authenticate",
    b"etag": b"ETag",
    b"te": b"TE",
    b"content-md5": b"Content-MD5",
    b"x-xss-protection": b"X-XSS-Protection",
}
_MAX_CACHED = 1024  # names an app can send are few; a bound keeps odd ones from growing the table


def _title(name: bytes) -> bytes:
    return b"-".join(part[:1].upper() + part[1:].lower() for part in name.split(b"-"))


_cache: dict[bytes, bytes] = dict(_SPECIAL)


def canonical_name(name: bytes) -> bytes:
    """`content-type` -> `Content-Type`; a name already spelled some other way is also normalised."""
    out = _cache.get(name)
    if out is None:
        lower = name.lower()
        out = _SPECIAL.get(lower) or _title(lower)
        if len(_cache) < _MAX_CACHED:
            _cache[name] = out
    return out


class CanonicalHeaders:
    """ASGI wrapper: every response's header names in canonical case. Attribute access goes to the wrapped
    app (as the other edge wrappers allow)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_canonical(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = message.get("headers") or ()
                message = {**message, "headers": [(canonical_name(k), v) for k, v in headers]}
            await send(message)

        await self.app(scope, receive, send_canonical)
