"""`create_app(state)`: the Litestar application (one Controller per resource group)."""

from __future__ import annotations

import logging
import mimetypes
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from litestar import Litestar, Request, Response, get
from litestar.exceptions import HTTPException, NotFoundException
from litestar.response import File
from litestar.static_files import create_static_files_router
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

import llama_webui

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


# A service worker that removes itself: a browser that once registered one for this address drops it and
# reloads its pages from the network (llama.cpp answers `/sw.js` with one when the web UI is off).
_UNREGISTER_SW = """self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => {
  event.waitUntil(
    self.registration
      .unregister()
      .then(() => self.clients.matchAll())
      .then((clients) => clients.forEach((client) => client.navigate(client.url))),
  );
});
"""


@get("/sw.js", include_in_schema=False, sync_to_thread=False)
def _unregister_service_worker() -> Response:
    return Response(_UNREGISTER_SW, media_type="application/javascript; charset=utf-8")


def _file_route(path: str, file: Path) -> Any:
    media_type = mimetypes.guess_type(file.name)[0] or "application/octet-stream"

    @get(path, name=f"webui:{path}", include_in_schema=False, sync_to_thread=False)
    def serve() -> File:
        return File(file, filename=file.name, media_type=media_type, content_disposition_type="inline")

    return serve


def _webui(config: ServerConfig) -> tuple[list[Any], frozenset[str]]:
    """The route handlers of the web UI (`llama_webui`'s files, or `--path DIR`) and the URL paths of its
    files, which stay public with an API key and are served while the model loads.

    One route per top-level file and one static-files router per top-level folder (`/_app`), not a
    catch-all at `/`: an unknown path keeps answering 404 for every method."""
    if not config.webui:
        return [_unregister_service_worker], frozenset({"/sw.js"})
    root = Path(config.static_path) if config.static_path else llama_webui.static_dir()
    files = frozenset("/" + p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    routes: list[Any] = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            routes.append(create_static_files_router(f"/{entry.name}", [entry], name=f"webui:{entry.name}"))
        elif entry.is_file():
            routes.append(_file_route(f"/{entry.name}", entry))
    if (root / "index.html").is_file():
        routes.append(_file_route("/", root / "index.html"))
    return routes, files


def create_app(state: ServerState | ServerConfig) -> Litestar:
    """The app for one model. Its lifespan loads the model in the background (the server answers 503
    `Loading model` until the engine is warmed up) and stops the engine on shutdown."""
    if isinstance(state, ServerConfig):
        state = ServerState(state)
    st: ServerState = state
    webui_routes, webui_files = _webui(st.config)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        st.start_loading()
        try:
            yield
        finally:
            st.shutdown()

    app = Litestar(
        route_handlers=[*CONTROLLERS, *webui_routes],
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
    app.asgi_handler = EdgeMiddleware(app.asgi_handler, st, webui_files)
    return app


def server_state(request: Request[Any, Any, Any]) -> ServerState:
    return request.app.state.server
