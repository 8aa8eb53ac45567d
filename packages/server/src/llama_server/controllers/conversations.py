"""OpenAI's Conversations API (`/v1/conversations`), kept in the server's store (`--store`, llama_server.store).

Create, get, update (metadata), delete; list, add, get and delete a conversation's items. Each API key sees
only its own conversations. Beyond OpenAI's routes, `GET /v1/conversations` lists the key's conversations
(newest first), so a client such as the web UI can show them in any browser.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.params import FromPath, FromQuery
from llama_tools.auth import key_scope

from ..errors import ApiError
from ..store import MAX_ITEMS_PER_CALL, Store, check_metadata, normalize_items
from ._common import SharedState, json_response

__all__ = ["ConversationsController"]

_ROOTS = ("/v1/conversations", "/conversations")


def _paths(tail: str = "") -> list[str]:
    return [root + tail for root in _ROOTS]


async def _object(request: Request[Any, Any, Any]) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise ApiError(f"Invalid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body


def _items(body: dict[str, Any], required: bool) -> list[dict[str, Any]]:
    items = body.get("items")
    if items is None:
        if required:
            raise ApiError("'items' is required")
        return []
    if not isinstance(items, list):
        raise ApiError("'items' must be an array")
    if len(items) > MAX_ITEMS_PER_CALL:
        raise ApiError(f"'items' holds at most {MAX_ITEMS_PER_CALL} items per request")
    return normalize_items(items)


def _caller(server: SharedState, request: Request[Any, Any, Any]) -> tuple[Store, str]:
    return server.require_store(), key_scope(server.config.api_keys, request.headers)


class ConversationsController(Controller):
    @post(_paths(), status_code=200)
    async def create(self, request: Request, server: SharedState) -> Response:
        store, owner = _caller(server, request)
        body = await _object(request)
        items, metadata = _items(body, False), check_metadata(body.get("metadata"))
        return json_response(await asyncio.to_thread(store.create_conversation, owner, items, metadata))

    @get(_paths())
    async def list_conversations(
        self,
        request: Request,
        server: SharedState,
        limit: FromQuery[int] = 20,
        order: FromQuery[str] = "desc",
        after: FromQuery[str | None] = None,
    ) -> Response:
        store, owner = _caller(server, request)
        page = await asyncio.to_thread(store.list_conversations, owner, limit, order, after)
        return json_response(page.body())

    @get(_paths("/{conv_id:str}"))
    async def get_conversation(
        self, request: Request, server: SharedState, conv_id: FromPath[str]
    ) -> Response:
        store, owner = _caller(server, request)
        return json_response(await asyncio.to_thread(store.get_conversation, owner, conv_id))

    @post(_paths("/{conv_id:str}"), status_code=200)
    async def update(self, request: Request, server: SharedState, conv_id: FromPath[str]) -> Response:
        store, owner = _caller(server, request)
        body = await _object(request)
        if "metadata" not in body:
            raise ApiError("'metadata' is required")
        metadata = check_metadata(body["metadata"])
        return json_response(await asyncio.to_thread(store.update_conversation, owner, conv_id, metadata))

    @delete(_paths("/{conv_id:str}"), status_code=200)
    async def delete_conversation(
        self, request: Request, server: SharedState, conv_id: FromPath[str]
    ) -> Response:
        store, owner = _caller(server, request)
        return json_response(await asyncio.to_thread(store.delete_conversation, owner, conv_id))

    @get(_paths("/{conv_id:str}/items"))
    async def list_items(
        self,
        request: Request,
        server: SharedState,
        conv_id: FromPath[str],
        limit: FromQuery[int] = 20,
        order: FromQuery[str] = "desc",
        after: FromQuery[str | None] = None,
    ) -> Response:
        store, owner = _caller(server, request)
        page = await asyncio.to_thread(store.list_items, owner, conv_id, limit, order, after)
        return json_response(page.body())

    @post(_paths("/{conv_id:str}/items"), status_code=200)
    async def add_items(self, request: Request, server: SharedState, conv_id: FromPath[str]) -> Response:
        store, owner = _caller(server, request)
        items = _items(await _object(request), True)
        page = await asyncio.to_thread(store.add_items, owner, conv_id, items)
        return json_response(page.body())

    @get(_paths("/{conv_id:str}/items/{item_id:str}"))
    async def get_item(
        self, request: Request, server: SharedState, conv_id: FromPath[str], item_id: FromPath[str]
    ) -> Response:
        store, owner = _caller(server, request)
        return json_response(await asyncio.to_thread(store.get_item, owner, conv_id, item_id))

    @post(_paths("/{conv_id:str}/items/{item_id:str}"), status_code=200)
    async def replace_item(
        self, request: Request, server: SharedState, conv_id: FromPath[str], item_id: FromPath[str]
    ) -> Response:
        """An extension of OpenAI's API: replace a stored item (body: the item), keeping its place."""
        store, owner = _caller(server, request)
        item = normalize_items([await _object(request)])[0]
        return json_response(await asyncio.to_thread(store.replace_item, owner, conv_id, item_id, item))

    @delete(_paths("/{conv_id:str}/items/{item_id:str}"), status_code=200)
    async def delete_item(
        self, request: Request, server: SharedState, conv_id: FromPath[str], item_id: FromPath[str]
    ) -> Response:
        store, owner = _caller(server, request)
        return json_response(await asyncio.to_thread(store.delete_item, owner, conv_id, item_id))
