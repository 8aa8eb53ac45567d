"""The edge of every request, as ASGI wrappers around the router (so that they also cover unknown routes
and Litestar's own errors).

`EdgeMiddleware`, in the reference's order (endpoints.md §0.4): CORS headers and OPTIONS, readiness (503
while the model loads or once the server is shutting down), the API key, and the `Server: llama.cpp`
header; then, for a request no API key authenticated, llama_tools' guard of the routes that act on the
machine (`/tools`, slot files, LoRA scales, `POST /props`, `/cors-proxy`): Host, Origin and Content-Type
against cross-site requests and DNS rebinding, before any body is read.

`IOTimeouts`, outermost: `--timeout` as cpp-httplib's read and write timeouts, so a client that stops
sending its request body, or stops reading the response, cannot hold a connection (and a slot) forever.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import msgspec
from llama_tools import CorsPolicy, RequestGuard
from llama_tools.auth import api_key_ok

from .errors import error_body
from .state import DRAIN_MESSAGE, ServerState

__all__ = ["EdgeMiddleware", "IOTimeouts"]

log = logging.getLogger("llama_server")

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/", "/index.html"})


class EdgeMiddleware:
    def __init__(self, app: Any, state: ServerState, assets: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.state = state
        # the web UI's files (`/`, `/index.html`, `/_app/...`): public, and served while the model loads
        self.assets = assets | {"/", "/index.html"}
        self.keys = [k.encode() for k in state.config.api_keys]
        cfg = state.config
        self.cors = CorsPolicy(cfg.cors_origins, cfg.cors_methods, cfg.cors_headers, cfg.cors_credentials)
        self.guard = RequestGuard(self.cors, cfg.host)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        extra = self._cors(headers, scope["method"] == "OPTIONS")
        extra.append((b"server", b"llama.cpp"))

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        if scope["method"] == "OPTIONS":
            await _respond(send_with_headers, 200, b"", b"text/html")
            return
        path = scope["path"]
        prefix = self.state.config.api_prefix
        if not self.state.ready.is_set() and path not in self.assets:
            await _json(send_with_headers, 503, "Loading model", "unavailable_error")
            return
        if self.state.draining:
            await _json(send_with_headers, 503, DRAIN_MESSAGE, "unavailable_error")
            return
        public = (path in PUBLIC_PATHS or path in self.assets) and not prefix
        authenticated = bool(self.keys) and self._authorized(headers)
        if self.keys and not public and not authenticated:
            await _json(send_with_headers, 401, "Invalid API Key", "authentication_error")
            return
        if not authenticated:
            route = path[len(prefix) :] or "/" if prefix and path.startswith(prefix) else path
            refusal = self.guard.check(scope["method"], route, scope.get("headers", []))
            if refusal is not None:
                log.warning("refused %s %s: %s", scope["method"], path, refusal.message)
                await _json(send_with_headers, refusal.status, refusal.message, refusal.type)
                return
        await self.app(scope, receive, send_with_headers)

    def _authorized(self, headers: dict[str, str]) -> bool:
        return api_key_ok(self.keys, headers)

    def _cors(self, headers: dict[str, str], preflight: bool) -> list[tuple[bytes, bytes]]:
        # the policy (`*`, `localhost`, a literal origin) is llama_tools', shared with llama-router
        origin = headers.get("origin", "")
        return [
            (k.lower().encode(), v.encode("latin-1", "replace"))
            for k, v in self.cors.response_headers(origin, preflight)
        ]


async def _respond(send: Any, status: int, body: bytes, content_type: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _json(send: Any, status: int, message: str, type: str) -> None:
    body = msgspec.json.encode(error_body(status, message, type))
    await _respond(send, status, body, b"application/json; charset=utf-8")


class IOTimeouts:
    """The `--timeout` seconds as per-operation limits on one HTTP exchange (cpp-httplib's read and write
    timeouts, not a limit on the whole request: a long generation is fine as long as data moves).

    Read: each wait for more of the request body. When it passes, the app sees a disconnect and the client
    gets 408 with `Connection: close`. Write: each send of response data (uvicorn's send waits while the
    client does not read). When it passes, the connection is dropped; the handler's cleanup cancels its
    engine requests. Attribute access goes to the wrapped app (`.state` and the like).
    """

    def __init__(self, app: Any, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.seconds <= 0:
            await self.app(scope, receive, send)
            return
        limit = self.seconds
        flags = {"body_done": False, "started": False, "read_timeout": False, "write_timeout": False}

        async def timed_receive() -> dict[str, Any]:
            if flags["body_done"] or flags["read_timeout"]:
                return await receive()  # only a disconnect comes after the body: no limit on waiting for it
            try:
                msg = await asyncio.wait_for(receive(), limit)
            except TimeoutError:
                flags["read_timeout"] = True
                log.info("read timeout (%s s) on %s %s", limit, scope.get("method"), scope.get("path"))
                return {"type": "http.disconnect"}
            if msg["type"] != "http.request" or not msg.get("more_body", False):
                flags["body_done"] = True
            return msg  # type: ignore[no-any-return]

        async def timed_send(msg: dict[str, Any]) -> None:
            if flags["read_timeout"] or flags["write_timeout"]:
                return  # the exchange is over: this wrapper answers (or drops) it
            if msg["type"] == "http.response.start":
                flags["started"] = True
            try:
                await asyncio.wait_for(send(msg), limit)
            except TimeoutError:
                flags["write_timeout"] = True
                log.info("write timeout (%s s) on %s %s", limit, scope.get("method"), scope.get("path"))
                raise ConnectionAbortedError("the client did not read the response in time") from None

        try:
            await self.app(scope, timed_receive, timed_send)
        except Exception:
            if not (flags["read_timeout"] or flags["write_timeout"]):
                raise
        if flags["read_timeout"] and not flags["started"]:
            body = json.dumps(
                {"error": {"code": 408, "message": "Request timeout", "type": "invalid_request_error"}}
            ).encode()
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            await send({"type": "http.response.start", "status": 408, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
