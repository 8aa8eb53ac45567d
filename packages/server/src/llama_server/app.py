"""`create_app(state)`: the Litestar application (one Controller per resource group)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Request, Response
from litestar.exceptions import HTTPException, NotFoundException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from .config import ServerConfig
from .controllers import CONTROLLERS
from .errors import ApiError, error_body
from .middleware import EdgeMiddleware
from .state import ServerState

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


def _http_error(_: Request, exc: HTTPException) -> Response:
    code = exc.status_code
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 501: "not_supported_error",
            503: "unavailable_error"}.get(code, "invalid_request_error" if code < 500 else "server_error")  # fmt: skip
    message = exc.detail
    if code == 413:
        message = "Request body is too large"
    elif code == 405:
        message = "Method Not Allowed"
    return Response(
        error_body(code, str(message), kind), status_code=code, media_type=JSON, headers=exc.headers
    )


def _internal_error(_: Request, exc: Exception) -> Response:
    log.exception("internal error", exc_info=exc)
    return Response(
        error_body(500, f"{type(exc).__name__}: {exc}", "server_error"),
        status_code=HTTP_500_INTERNAL_SERVER_ERROR,
        media_type=JSON,
    )


def create_app(state: ServerState | ServerConfig) -> Litestar:
    """The app for one model. Its lifespan loads the model in the background (the server answers 503
    `Loading model` until the engine is warmed up) and stops the engine on shutdown."""
    if isinstance(state, ServerConfig):
        state = ServerState(state)
    st: ServerState = state

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        st.start_loading()
        try:
            yield
        finally:
            st.shutdown()

    app = Litestar(
        route_handlers=[*CONTROLLERS],
        lifespan=[lifespan],
        dependencies={},
        exception_handlers={
            ApiError: _api_error,
            NotFoundException: _not_found,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
        request_max_body_size=st.config.max_body_bytes,
        path=st.config.api_prefix or "/",
        openapi_config=None,
        logging_config=None,
        debug=False,
    )
    app.state.server = st
    # outermost: CORS, readiness, API key and the Server header cover every path, even unknown ones
    app.asgi_handler = EdgeMiddleware(app.asgi_handler, st)
    return app


def server_state(request: Request[Any, Any, Any]) -> ServerState:
    return request.app.state.server
