"""`create_app(state)`: the whole application that ships, the one `llama-server` serves.

One Controller per resource group; handlers get the shared `ServerState` by dependency injection
(`state: ServerState`) and their bodies as msgspec Structs (`data: <Struct>`), decoded by Litestar after the
body size limit. Around the router: the edge (CORS, readiness, API key, `Server` header) and, outermost,
the `--timeout` read and write limits. Every error is answered in the reference's JSON error shape.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from litestar import Litestar, Request, Response
from litestar.di import Provide
from litestar.exceptions import (
    HTTPException,
    NotFoundException,
    SerializationException,
    ValidationException,
)
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from llama_tools import ToolsService, tools_route_handlers
from llama_tools.webui import webui_routes

import llama_webui

from .config import ServerConfig
from .controllers import CONTROLLERS
from .controllers.predict import vertex_routes
from .errors import ApiError, error_body
from .headers import CanonicalHeaders
from .middleware import EdgeMiddleware, IOTimeouts
from .sleep import sleep_gate
from .state import ServerState
from .streaming import end_streams

__all__ = ["create_app"]

log = logging.getLogger("llama_server")
JSON = "application/json; charset=utf-8"


def _api_error(_: Request, exc: ApiError) -> Response:
    return Response(exc.body(), status_code=exc.code, media_type=JSON, headers=exc.headers)


def _not_found(_: Request, exc: NotFoundException) -> Response:
    return Response(
        {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}},
        status_code=404,
        media_type=JSON,
    )


_KINDS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


def _json_error(code: int, message: str, headers: dict[str, str] | None = None) -> Response:
    kind = _KINDS.get(code, "invalid_request_error" if code < 500 else "server_error")
    return Response(error_body(code, message, kind), status_code=code, media_type=JSON, headers=headers)


def _http_error(_: Request, exc: HTTPException) -> Response:
    code = exc.status_code
    message = str(exc.detail)
    if code == 413:
        message = "Request body is too large"
    elif code == 405:
        message = "Method Not Allowed"
    elif code == 400 and isinstance(exc.__cause__, SerializationException):
        message = f"Invalid JSON: {exc.detail}"  # the body is not JSON (Litestar's decoding)
    return _json_error(code, message, exc.headers)


def _validation_error(_: Request, exc: ValidationException) -> Response:
    """A body that does not match its Struct: msgspec's message, with the path inside the body."""
    cause = str(exc.__cause__ or exc.detail)
    if "missing required field `data`" in cause:  # no body at all
        return _json_error(400, "Request body is empty: a JSON object is expected")
    return _json_error(400, "Invalid request: " + cause.replace("`$.data.", "`$.").replace("`$.data`", "`$`"))


def _too_deep(_: Request, exc: RecursionError) -> Response:
    # only a request body nests deeply enough to exhaust the stack (decoding it)
    return _json_error(400, "Invalid JSON: nested too deeply")


def _internal_error(_: Request, exc: Exception) -> Response:
    log.exception("internal error", exc_info=exc)
    return Response(
        error_body(500, f"{type(exc).__name__}: {exc}", "server_error"),
        status_code=HTTP_500_INTERNAL_SERVER_ERROR,
        media_type=JSON,
    )


def _webui(config: ServerConfig) -> tuple[list[Any], frozenset[str]]:
    """The route handlers of the web UI (`llama_webui`'s files, or `--path DIR`; llama_tools' `webui_routes`,
    which llama-router serves too) and the URL paths of its files, which stay public with an API key and are
    served while the model loads."""
    if not config.webui:
        return webui_routes(None)
    return webui_routes(Path(config.static_path) if config.static_path else llama_webui.static_dir())


def create_app(state: ServerState | ServerConfig) -> Litestar:
    """The app for one model, with everything `llama-server` serves it with. Its lifespan loads the model
    in the background (the server answers 503 `Loading model` until the engine is warmed up) and stops the
    engine on shutdown; `state.begin_drain()` ends the open streams first (the CLI calls it on SIGTERM)."""
    if isinstance(state, ServerConfig):
        state = ServerState(state)
    st: ServerState = state
    webui_routes, webui_files = _webui(st.config)
    tools = ToolsService(st.config.tools)  # /tools (built-ins, MCP children) and /cors-proxy: llama_tools

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        st.loop = asyncio.get_running_loop()
        st.start_loading()
        try:
            yield
        finally:
            st.shutdown()

    app = Litestar(
        route_handlers=[
            *CONTROLLERS,
            *tools_route_handlers(tools),
            *webui_routes,
            *vertex_routes(st.config.api_prefix),
        ],
        lifespan=[lifespan, tools.lifespan],
        dependencies={"server": Provide(lambda: st, use_cache=True, sync_to_thread=False)},
        exception_handlers={
            ApiError: _api_error,
            NotFoundException: _not_found,
            ValidationException: _validation_error,
            HTTPException: _http_error,
            RecursionError: _too_deep,
            Exception: _internal_error,
        },
        request_max_body_size=st.config.max_body_bytes,
        path=st.config.api_prefix or "/",
        openapi_config=None,
        logging_config=None,
        debug=False,
    )
    app.state.server = st
    st.drain_hooks.append(end_streams)  # SIGTERM: every open generation ends with its final event
    st.drain_hooks.append(lambda _message: tools.begin_shutdown())  # tool calls in flight end too
    # around the router: CORS, readiness, API key and the Server header cover every path, even unknown
    # ones; outermost, the read and write timeouts cover the whole exchange
    edge = IOTimeouts(EdgeMiddleware(sleep_gate(app, st), st, webui_files), st.config.timeout)
    app.asgi_handler = CanonicalHeaders(edge)  # header names as llama-server spells them
    return app
