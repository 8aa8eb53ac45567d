"""Resumable streams through the router (streams-and-tools.md §1.10): the `conv_id -> model` map filled
by forwarded POSTs carrying `X-Conversation-Id`, and `/v1/stream`, `/v1/streams/lookup`, `DELETE
/v1/stream` resolved through it (exact ids only, no fan-out).

With API keys a conversation is scoped to the key that started it, as in llama-server: the map is keyed by
`child_id(scope, id)` and that is also the id the child sees (children hold one private key, so the
router keeps the clients apart by giving each key's conversations ids of their own). Another key's GET,
lookup or DELETE of the same id resolves to nothing. Without keys the id goes to the child unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
from litestar import Request, Response, delete, get, post
from litestar.response import Stream
from llama_tools.auth import key_scope

from .upstream import Upstream, UpstreamError

__all__ = ["ConversationMap", "child_id", "stream_routes"]

JSON = "application/json; charset=utf-8"
BUDGET = httpx.Timeout(0.25)  # the router's loopback lookup/stop calls
_LOADING = frozenset({"loading", "downloading", "downloaded"})


def child_id(scope: str, conv: str) -> str:
    """The id a conversation has in the map and at the child: the client's id, prefixed by its key's
    scope when the router has keys (two keys using one id never meet in a child)."""
    return f"{scope}:{conv}" if scope else conv


def _request_id(request: Request, conv: str) -> str:
    return child_id(key_scope(request.app.state.manager.config.api_keys, request.headers), conv)


class ConversationMap:
    """conv_id -> (model name, ticket). A newer registration or a forget makes older tickets stale."""

    def __init__(self) -> None:
        self._map: dict[str, tuple[str, int]] = {}
        self._tickets = itertools.count(1)

    def register(self, conv: str, model: str) -> int:
        ticket = next(self._tickets)
        self._map[conv] = (model, ticket)
        return ticket

    def current(self, conv: str, ticket: int) -> bool:
        return self._map.get(conv, ("", 0))[1] == ticket

    def owner(self, conv: str) -> str | None:
        hit = self._map.get(conv)
        return hit[0] if hit else None

    def forget(self, conv: str) -> None:
        self._map.pop(conv, None)


def _error(code: int, message: str, kind: str) -> Response:
    return Response(
        {"error": {"code": code, "message": message, "type": kind}}, status_code=code, media_type=JSON
    )


def _owner(request: Request, conv: str) -> Any:
    name = request.app.state.conversations.owner(conv)
    return request.app.state.manager.resolve(name) if name else None


def _bearer(key: str) -> dict[str, str]:
    """The header carrying a child's or replica's own key (none without one)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def _endpoint(inst: Any, cid: str) -> tuple[str, dict[str, str]] | None:
    """Where the conversation's stream lives: the model's child, or (a model replicated on a Ray
    cluster) the replica its last request went to; None when that replica is gone."""
    if inst.pool is None:
        return inst.base_url, _bearer(inst.key)
    replica = inst.pool.replica_of("c:" + cid)
    if replica is None:
        return None
    return replica.url, _bearer(replica.key)


@get("/v1/stream")
async def get_stream(request: Request) -> Response | Stream:
    conv = request.query_params.get("conv_id") or ""
    if not conv:
        return _error(400, "Missing conversation id in path", "invalid_request_error")
    cid = _request_id(request, conv)
    inst = _owner(request, cid)
    if inst is not None and inst.status in _LOADING:
        return _error(503, "Stream owner model is loading, retry later", "unavailable_error")
    where = _endpoint(inst, cid) if inst is not None and inst.status == "loaded" else None
    if where is None:
        return _error(404, "Stream not found or expired", "not_found_error")
    params = {"conv_id": cid}
    if "from" in request.query_params:
        params["from"] = request.query_params["from"]
    url = where[0] + "/v1/stream?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
    headers = [(k.lower().encode(), v.encode()) for k, v in where[1].items()]
    upstream: Upstream = request.app.state.upstream  # the proxied routes' relay client
    try:
        resp = await upstream.request("GET", url, headers)
        if not resp.header(b"content-type").startswith(b"text/event-stream"):
            body = await resp.aread()
            await resp.aclose()
            media = resp.header(b"content-type").decode("latin-1") or JSON
            return Response(body, status_code=resp.status, media_type=media)
    except UpstreamError as e:
        return Response(f"proxy error: {e}", status_code=500, media_type="text/plain")

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.chunks():
                yield chunk
        except UpstreamError:
            return
        finally:
            await resp.aclose()  # a reader that went away closes the connection: the child's reader ends

    return Stream(relay(), status_code=resp.status, media_type="text/event-stream")


@post("/v1/streams/lookup", status_code=200)
async def lookup_streams(request: Request) -> Response:
    try:
        data = json.loads(await request.body())
    except ValueError:
        return Response([], media_type=JSON)
    ids = data.get("conversation_ids") if isinstance(data, dict) else None
    groups: dict[str, list[str]] = {}  # where the streams live -> their ids
    places: dict[str, dict[str, str]] = {}  # -> the headers it takes
    asked: dict[str, str] = {}  # child id -> the id the client named
    for conv in ids if isinstance(ids, list) else []:
        if isinstance(conv, str) and conv:
            cid = _request_id(request, conv)
            inst = _owner(request, cid)
            where = _endpoint(inst, cid) if inst is not None and inst.status == "loaded" else None
            if where is not None:
                groups.setdefault(where[0], []).append(cid)
                places[where[0]] = where[1]
                asked[cid] = conv
    client: httpx.AsyncClient = request.app.state.client

    async def ask(base: str, convs: list[str]) -> list[Any]:
        try:
            r = await client.post(
                base + "/v1/streams/lookup",
                json={"conversation_ids": convs},
                headers=places[base],
                timeout=BUDGET,
            )
            out = r.json()
            return [
                {**e, "conversation_id": asked[e["conversation_id"]]}
                for e in out
                if isinstance(e, dict) and e.get("conversation_id") in convs
            ]
        except (httpx.HTTPError, ValueError, TypeError):
            return []

    parts = await asyncio.gather(*(ask(n, c) for n, c in groups.items()))
    return Response([e for p in parts for e in p], media_type=JSON)


@delete("/v1/stream", status_code=200)
async def delete_stream(request: Request) -> Response:
    conv = request.query_params.get("conv_id") or ""
    if not conv:
        return _error(400, "Missing conversation id in path", "invalid_request_error")
    cid = _request_id(request, conv)
    inst = _owner(request, cid)
    request.app.state.conversations.forget(cid)  # also cancels a request still waiting for its model
    where = _endpoint(inst, cid) if inst is not None and (inst.child is not None or inst.pool) else None
    if where is not None:
        client: httpx.AsyncClient = request.app.state.client
        with contextlib.suppress(httpx.HTTPError):
            await client.delete(
                where[0] + "/v1/stream",
                params={"conv_id": cid},
                headers=where[1],
                timeout=BUDGET,
            )
    return Response(None, status_code=204, media_type=JSON)


def stream_routes() -> list[Any]:
    return [get_stream, lookup_streams, delete_stream]
