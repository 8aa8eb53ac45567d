"""The Litestar route handlers of `/tools` and `/cors-proxy`, mounted by `llama-server` and `llama-router`.

`tools_route_handlers(service)` gives `GET|POST /tools` and `GET|POST /cors-proxy`. A feature that is
off answers 403 with the reference's `feature_disabled` body. Error bodies of `POST /tools` are flat
(`{"code", "message", "type"}`), as llama-server's are.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import msgspec
from litestar import Request, Response, get, post, route
from litestar.handlers import HTTPRouteHandler
from litestar.response import Stream

from .builtin import ParamError, RuntimeSpecError
from .proxy import ProxyError, TargetRefused
from .service import ToolError, ToolsService

__all__ = ["FEATURE_DISABLED", "tools_route_handlers"]

log = logging.getLogger("llama_tools")

JSON = "application/json; charset=utf-8"
FEATURE_DISABLED = {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _json(body: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(body), status_code=status, media_type=JSON)


def _disabled() -> Response[bytes]:
    return _json(FEATURE_DISABLED, 403)


def _flat(status: int, message: str, kind: str) -> Response[bytes]:
    return _json({"code": status, "message": message, "type": kind}, status)


async def _post_tools(service: ToolsService, request: Request[Any, Any, Any]) -> Response[Any]:
    try:
        name, params, stream = service.parse_body(await request.body())
        tool = service.find(name, stream)
        params = await service.prepare(params, request.headers)
        if stream:
            assert not hasattr(tool, "server")  # find() allows streaming for built-ins only
            return Stream(
                service.stream(tool, params),  # type: ignore[arg-type]
                media_type="text/event-stream",
                headers=_SSE_HEADERS,
            )
        return _json(await service.invoke(tool, params))
    except ToolError as e:
        return _json(e.body(), e.status)
    except ParamError as e:
        return _flat(400, str(e), "invalid_request_error")
    except RuntimeSpecError as e:
        return _flat(500, str(e), "server_error")
    except Exception as e:  # the reference answers any other failure with 500 and its message
        log.exception("POST /tools failed")
        return _flat(500, str(e) or type(e).__name__, "server_error")


async def _proxy(service: ToolsService, request: Request[Any, Any, Any]) -> Response[Any]:
    url = request.query_params.get("url", "")
    try:
        reply = await service.proxy.open(request.method, url, request.headers, await request.body())
    except TargetRefused as e:
        return _json({"error": {"code": 403, "message": str(e), "type": "permission_error"}}, 403)
    except ProxyError as e:
        return _json({"error": {"code": 500, "message": str(e), "type": "server_error"}}, 500)
    except httpx.HTTPError as e:
        return Response(f"proxy error: {e or type(e).__name__}", status_code=500, media_type="text/plain")
    if reply.bodyless:
        await reply.aclose()
        return Response(b"", status_code=reply.status, headers=dict(reply.headers))
    media_type = next((v for k, v in reply.headers if k.lower() == "content-type"), None)
    headers = {k: v for k, v in reply.headers if k.lower() != "content-type"}
    return Stream(reply.body(), status_code=reply.status, headers=headers, media_type=media_type)


def tools_route_handlers(service: ToolsService) -> list[HTTPRouteHandler]:
    """`GET|POST /tools` (403 unless tools or MCP servers are on) and `GET|POST /cors-proxy` (403 unless
    `--ui-mcp-proxy` or `--agent`)."""

    @get("/tools", sync_to_thread=False, include_in_schema=False)
    def list_tools() -> Response[bytes]:
        return _json(service.listing()) if service.enabled else _disabled()

    @post("/tools", status_code=200, include_in_schema=False)
    async def call_tool(request: Request[Any, Any, Any]) -> Response[Any]:
        return await _post_tools(service, request) if service.enabled else _disabled()

    @route("/cors-proxy", http_method=["GET", "POST"], status_code=200, include_in_schema=False)
    async def cors_proxy(request: Request[Any, Any, Any]) -> Response[Any]:
        return await _proxy(service, request) if service.config.cors_proxy else _disabled()

    return [list_tools, call_tool, cors_proxy]
