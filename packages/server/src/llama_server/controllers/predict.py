"""Vertex AI prediction mode (`AIP_MODE=PREDICTION`, endpoints.md §24): `POST <AIP_PREDICT_ROUTE>` (default
`/predict`) with `{"instances": [...]}`. Each instance names a route in `@requestFormat` (its path, or the
path's camelCase alias: `/v1/chat/completions` -> `chatCompletions`) and is sent, in parallel with the others
and `stream` forced off, to that route through the whole app (API key, readiness and limits apply as for a
direct call). The answer is `{"predictions": [each route's JSON body, error objects included]}`.
`AIP_HEALTH_ROUTE` adds a second health route.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
from litestar import Request, Response, get, post

from ..errors import ApiError, error_body
from ._common import json_response

__all__ = ["MAX_INSTANCES", "gcp_alias", "vertex_routes"]

MAX_INSTANCES = 128
_FORWARDED = ("authorization", "x-api-key")


def gcp_alias(path: str) -> str:
    """`/v1/chat/completions` -> `chatCompletions`, `/apply-template` -> `applyTemplate`."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    s = s.removeprefix("/").split(":", 1)[0].split("{", 1)[0]
    out, cap = [], False
    for ch in s:
        if ch in "/-_":
            cap = True
        else:
            out.append(ch.upper() if cap else ch)
            cap = False
    return "".join(out)


def _env_route(name: str, default: str) -> str:
    value = os.environ.get(name) or default
    return value if not value or value.startswith("/") else "/" + value


def _post_paths(app: Any, prefix: str) -> dict[str, str]:
    """Every POST route of the app by its path (without `--api-prefix`) and by its camelCase alias (the
    first path of an alias wins), to the full path."""
    paths: dict[str, str] = {}
    for route in app.routes:
        if "POST" in getattr(route, "methods", set()) and "{" not in route.path:
            bare = route.path[len(prefix) :] if prefix and route.path.startswith(prefix) else route.path
            paths.setdefault(bare, route.path)
    for bare, full in list(paths.items()):
        paths.setdefault(gcp_alias(bare), full)
    return paths


async def _one(
    client: httpx.AsyncClient, paths: dict[str, str], instance: Any, headers: dict[str, str]
) -> Any:
    if not isinstance(instance, dict):
        return error_body(400, "each instance must be a JSON object", "invalid_request_error")
    fmt = instance.get("@requestFormat")
    if not isinstance(fmt, str):
        return error_body(400, "each instance must include a string @requestFormat", "invalid_request_error")
    path = paths.get(fmt)
    if path is None:
        return error_body(400, f"no handler registered for @requestFormat: {fmt}", "invalid_request_error")
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    if "stream" in payload:
        payload["stream"] = False
    r = await client.post(path, json=payload, headers=headers)
    try:
        return r.json()
    except ValueError:
        return r.text or None


def vertex_routes(api_prefix: str = "") -> list[Any]:
    """The prediction routes, when the environment asks for Vertex AI mode; else none."""
    if os.environ.get("AIP_MODE") != "PREDICTION":
        return []
    predict_path = _env_route("AIP_PREDICT_ROUTE", "/predict")

    @post(predict_path, status_code=200, name="vertex:predict")
    async def predict(request: Request) -> Response:
        try:
            body = await request.json()
        except Exception as e:
            raise ApiError(f"Invalid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ApiError("request body must be a JSON object")
        instances = body.get("instances")
        if not isinstance(instances, list):
            raise ApiError("request body must include an array field named instances")
        if len(instances) > MAX_INSTANCES:
            raise ApiError(f"instances array exceeds maximum size of {MAX_INSTANCES}")
        paths = _post_paths(request.app, api_prefix)
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED}
        app: Any = request.app  # Litestar's ASGI signature is narrower than httpx's annotation
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://vertex", timeout=None) as c:
            predictions = await asyncio.gather(*(_one(c, paths, i, headers) for i in instances))
        return json_response({"predictions": list(predictions)})

    routes: list[Any] = [predict]
    health_path = _env_route("AIP_HEALTH_ROUTE", "")
    if health_path:

        @get(health_path, name="vertex:health", sync_to_thread=False)
        def health(request: Request) -> Response:
            return json_response({"status": "ok"})

        routes.append(health)
    return routes
