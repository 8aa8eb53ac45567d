"""Response header names in canonical case (`Access-Control-Allow-Origin`, `Content-Type`), as llama-server
sends them.

HTTP says header names are case-insensitive, but clients that copy headers into a plain dictionary (Python's
`dict(response.headers)`, JavaScript objects) look them up case-sensitively, and Litestar and the edge
middleware write them in lower case. `CanonicalHeaders` rewrites each name of `http.response.start` once
(llama_tools' `canonical_name`, which llama-router uses too): a dictionary lookup per header, filled on first
sight of a name.
"""

from __future__ import annotations

from typing import Any

from llama_tools.headers import canonical_name

__all__ = ["CanonicalHeaders", "canonical_name"]


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
