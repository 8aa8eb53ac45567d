"""The edge of every router request (the same rules as llama-server's, endpoints.md §0.4): CORS headers
(llama_tools' `CorsPolicy`, the one llama-server uses) and OPTIONS, the API key (only `/health` and the web
UI's files are public), the `Server` header, and every response header name in canonical case (llama_tools'
`wire_name`: clients that copy headers into a plain dictionary look `Access-Control-Allow-Origin` up as
llama-server spells it, where uvicorn's httptools protocol would write it in lower case).

Then, for a request no API key authenticated, llama_tools' guard of the routes that act on the machine
(model loads, unloads, downloads and removals, `/tools`, `/cors-proxy`, and the slot, LoRA and props POSTs
proxied to children): Host, Origin and Content-Type against cross-site requests and DNS rebinding, before
any body is read or anything is forwarded."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from llama_tools import RequestGuard
from llama_tools.auth import api_key_ok
from llama_tools.headers import wire_name

from .config import RouterConfig
from .proxy import send_error

__all__ = ["Edge"]

log = logging.getLogger("llama_router")

PUBLIC = frozenset({"/health", "/v1/health", "/", "/index.html"})


class Edge:
    def __init__(self, app: Any, config: RouterConfig, assets: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.config = config
        self.keys = [k.encode() for k in config.api_keys]
        self.public = PUBLIC | assets
        self.guard = RequestGuard(config.cors, config.host)
        # run on the event loop at the first SIGTERM/SIGINT, before the open connections are waited for
        self.on_exit: Callable[[], None] = lambda: None

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
            if message["type"] == "http.response.start":  # names in canonical case, as llama-server's
                names = [*message.get("headers", []), *extra]
                message = {**message, "headers": [(wire_name(k), v) for k, v in names]}
            await send(message)

        if scope["method"] == "OPTIONS":
            await send_edge(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
            )
            await send_edge({"type": "http.response.body", "body": b""})
            return
        authenticated = bool(self.keys) and self._authorized(headers)
        if self.keys and scope["path"] not in self.public and not authenticated:
            await send_error(send_edge, 401, "Invalid API Key", "authentication_error")
            return
        if not authenticated:
            refusal = self.guard.check(scope["method"], scope["path"], scope.get("headers", []))
            if refusal is not None:
                log.warning("refused %s %s: %s", scope["method"], scope["path"], refusal.message)
                await send_error(send_edge, refusal.status, refusal.message, refusal.type)
                return
        await self.app(scope, receive, send_edge)

    def _authorized(self, headers: dict[str, str]) -> bool:
        return api_key_ok(self.keys, headers)
