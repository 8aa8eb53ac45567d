"""The edge of every router request (the same rules as llama-server's, endpoints.md §0.4): CORS headers
(llama_tools' `CorsPolicy`, the one llama-server uses) and OPTIONS, the API key (only `/health` and the web UI's files are public), no `Server` header."""

from __future__ import annotations

from typing import Any

from llama_tools.auth import api_key_ok

from .config import RouterConfig
from .proxy import send_error

__all__ = ["Edge"]

PUBLIC = frozenset({"/health", "/v1/health", "/", "/index.html"})


class Edge:
    def __init__(self, app: Any, config: RouterConfig, assets: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.config = config
        self.keys = [k.encode() for k in config.api_keys]
        self.public = PUBLIC | assets

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        config = self.config
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        extra = [
            (k.lower().encode(), v.encode("latin-1", "replace"))
            for k, v in config.cors.response_headers(headers.get("origin", ""), scope["method"] == "OPTIONS")
        ]
        extra.append((b"server", b"llama.cpp"))

        async def send_edge(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        if scope["method"] == "OPTIONS":
            await send_edge(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
            )
            await send_edge({"type": "http.response.body", "body": b""})
            return
        if self.keys and scope["path"] not in self.public and not self._authorized(headers):
            await send_error(send_edge, 401, "Invalid API Key", "authentication_error")
            return
        await self.app(scope, receive, send_edge)

    def _authorized(self, headers: dict[str, str]) -> bool:
        return api_key_ok(self.keys, headers)
