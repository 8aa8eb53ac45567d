"""`create_app(config)`: the router. Proxied routes go straight to `Proxy` (plain ASGI, streamed); the
router's own routes (health, props, the model list and its management, SSE, streams, the web UI at `/`)
are a Litestar app. Around both: the edge (CORS, API key; the web UI's files stay public)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
from litestar import Litestar, Request, Response, delete, get, post
from litestar.exceptions import HTTPException, NotFoundException
from litestar.response import Stream
from llama_tools import ToolsService, tools_route_handlers
from llama_tools.webui import webui_routes

import llama_webui

from . import __version__
from .cluster import Cluster
from .config import RouterConfig
from .downloads import Downloads
from .edge import Edge
from .models import Instance, LoadError, ModelManager
from .proxy import Proxy, is_proxied, model_from_body
from .replicas import check_replicas
from .streams import ConversationMap, stream_routes

__all__ = ["create_app"]

log = logging.getLogger("llama_router")
JSON = "application/json; charset=utf-8"
BUILD_INFO = f"b{__version__}-llama-router"
CREATED = int(time.time())


def _error(
    code: int, message: str, kind: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    kind = kind or ("invalid_request_error" if code < 500 else "server_error")
    return Response(
        {"error": {"code": code, "message": message, "type": kind}},
        status_code=code,
        media_type=JSON,
        headers=headers,
    )


def _load_error(_: Request, exc: LoadError) -> Response:
    return _error(exc.code, exc.message, exc.kind)


def _not_found(_: Request, exc: NotFoundException) -> Response:
    return _error(404, "File Not Found", "not_found_error")


def _http_error(_: Request, exc: HTTPException) -> Response:
    return _error(exc.status_code, str(exc.detail))


def _manager(request: Request) -> ModelManager:
    return request.app.state.manager  # type: ignore[no-any-return]


def model_status(inst: Instance, command: tuple[str, ...]) -> dict[str, Any]:
    """`status` of a model in `GET /models`: `args` is the command line used, or that would be."""
    args = inst.args or (
        list(inst.entry.remote) if inst.entry.remote else [*command, *inst.entry.child_args()]
    )
    st: dict[str, Any] = {"value": inst.status, "args": args}
    st["preset"] = inst.entry.preset_text()
    if inst.entry.pinned:
        st["pinned"] = True
    if inst.running and inst.unload_at is not None:  # keep-alive: when it unloads if still idle then
        st["unload_at"] = round(inst.unload_at, 3)
    if inst.pool is not None:  # replicas on a Ray cluster: each with its node and state
        st["cluster"] = inst.pool.describe()
    if inst.exit_code is not None and inst.exit_code != 0 and not inst.running:
        st["exit_code"], st["failed"] = inst.exit_code, True
    return st


def model_item(inst: Instance, command: tuple[str, ...]) -> dict[str, Any]:
    e = inst.entry
    arch = inst.architecture or {"input_modalities": e.modalities(), "output_modalities": ["text"]}
    item: dict[str, Any] = {
        "id": e.name,
        "aliases": list(e.aliases),
        "tags": list(e.tags),
        "object": "model",
        "owned_by": "llamacpp",
        "created": CREATED,
        "status": model_status(inst, command),
        "architecture": arch,
        "source": e.source,
        "can_remove": e.source == "cache",
    }
    if inst.running:
        for k, v in inst.info.items():
            item.setdefault(k, v)
    return item


@get(["/health", "/v1/health"], sync_to_thread=False)
def health() -> Response:
    return Response({"status": "ok"}, media_type=JSON)


@get("/props")
async def props(request: Request) -> Response:
    m = _manager(request)
    cfg = m.config
    return Response(
        {
            "role": "router",
            "max_instances": cfg.models_max,
            "models_autoload": cfg.models_autoload,
            "model_alias": "llama-server",
            "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0},
            "ui_settings": {},
            "build_info": BUILD_INFO,
            "cors_proxy_enabled": cfg.tools.cors_proxy,
        },
        media_type=JSON,
    )


@get(["/models", "/v1/models"])
async def list_models(request: Request) -> Response:
    m = _manager(request)
    if request.query_params.get("reload"):
        await m.reload()
    data = [model_item(i, m.config.server_command) for i in m.instances.values() if not i.entry.hidden]
    return Response({"data": data, "object": "list"}, media_type=JSON)


async def _body_model(request: Request) -> str:
    try:
        raw = await request.body()
    except Exception:
        raw = b""
    return model_from_body(raw)


@post("/models/load", status_code=200)
async def load_model(request: Request) -> Response:
    m = _manager(request)
    inst = m.resolve(await _body_model(request))
    if inst is None:
        return _error(404, "model is not found", "not_found_error")
    await m.load(inst)
    return Response({"success": True}, media_type=JSON)


@post("/models/unload", status_code=200)
async def unload_model(request: Request) -> Response:
    m = _manager(request)
    inst = m.resolve(await _body_model(request))
    if inst is None:
        return _error(400, "model is not found")
    if inst.status == "downloading":
        await request.app.state.downloads.cancel(inst)
    else:
        await m.unload(inst)
    return Response({"success": True}, media_type=JSON)


@get("/models/sse")
async def models_sse(request: Request) -> Stream:
    m = _manager(request)
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    m.subscribers.add(queue)

    async def events() -> AsyncIterator[bytes]:
        try:
            yield b""  # the response starts now: the subscription is in place before the first event
            while (msg := await queue.get()) is not None:
                yield b"data: " + json.dumps(msg).encode() + b"\n\n"
        finally:
            m.subscribers.discard(queue)

    return Stream(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@post("/models", status_code=200)
async def download_model(request: Request) -> Response:
    spec = await _body_model(request)
    if not spec:
        return _error(400, "model must be a non-empty string")
    await request.app.state.downloads.start(spec)
    return Response({"success": True}, media_type=JSON)


@delete("/models", status_code=200)
async def delete_model(request: Request) -> Response:
    name = request.query_params.get("model") or ""
    if not name:
        return _error(400, "model must be a non-empty string")
    await request.app.state.downloads.remove(name)
    return Response({"success": True}, media_type=JSON)


class _Dispatch:
    """Proxied routes to `Proxy`, the rest to the Litestar app."""

    def __init__(self, app: Litestar, proxy: Proxy) -> None:
        self.app = app
        self.proxy = proxy

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            if is_proxied(scope["method"], scope["path"], query):
                await self.proxy(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _webui(config: RouterConfig) -> tuple[list[Any], frozenset[str]]:
    """The web UI as llama-server serves it (`llama_webui`'s files, `--path DIR`, or none with
    `--no-webui`), and the URL paths of its files (public even with an API key)."""
    if not config.webui:
        return webui_routes(None)
    return webui_routes(Path(config.static_path) if config.static_path else llama_webui.static_dir())


def create_app(config: RouterConfig) -> Any:
    """The router's ASGI app. Its lifespan starts the `load-on-startup` models and, on shutdown, stops
    every child (waiting for their exit)."""
    manager = ModelManager(config)
    if config.ray:
        cluster = Cluster(
            manager, config.ray, config.ray_namespace, config.ray_nodes, config.ray_keep_replicas
        )
        cluster.connect()
        manager.cluster = cluster
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(None, connect=10.0), limits=httpx.Limits(max_connections=None)
    )
    proxy = Proxy(manager, client)
    convs = ConversationMap()
    proxy.conversations = convs
    tools = ToolsService(config.tools)  # /tools (built-ins, MCP children) and /cors-proxy, as llama-server
    ui_routes, ui_files = _webui(config)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        if manager.cluster is not None:
            manager.cluster.begin()
        await manager.start_up()
        checker = asyncio.ensure_future(check_replicas(manager, client))
        keeper = asyncio.ensure_future(manager.keep_alive_loop())
        try:
            yield
        finally:
            checker.cancel()
            keeper.cancel()
            await app.state.downloads.shutdown()
            await manager.shutdown()
            await proxy.upstream.aclose()
            await client.aclose()

    app = Litestar(
        route_handlers=[
            health, props, list_models, load_model, unload_model, models_sse, download_model, delete_model,
            *stream_routes(), *tools_route_handlers(tools), *ui_routes,
        ],
        lifespan=[lifespan, tools.lifespan],
        exception_handlers={LoadError: _load_error, NotFoundException: _not_found, HTTPException: _http_error},
        openapi_config=None,
        logging_config=None,
        debug=False,
    )  # fmt: skip
    app.state.manager = manager
    app.state.client = client
    app.state.upstream = proxy.upstream
    app.state.conversations = convs
    app.state.downloads = Downloads(manager)
    edge = Edge(_Dispatch(app, proxy), config, ui_files)
    edge.on_exit = tools.begin_shutdown  # tool calls in flight end at once instead of holding the exit
    return edge
