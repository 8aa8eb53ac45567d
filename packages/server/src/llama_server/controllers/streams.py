"""GET /v1/stream, POST /v1/streams/lookup, DELETE /v1/stream: re-attach to, look up and stop the
resumable streams that `X-Conversation-Id` creates (streams-and-tools.md §1.6-1.8).

The id travels in the query string (`conv_id`, URL-encoded) because it may hold `/` and `::`
(`conv42::org/model`). Ids are capabilities: nothing lists them, logs show only a short prefix, and with
API keys a session is visible only to the key it was created under.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from llama_tools.auth import key_scope

from ..errors import ApiError
from ..resumable import Reader, Session, short_id
from ..state import ServerState
from ..streaming import EventStream, Replay
from ._common import SharedState, json_response

__all__ = ["StreamsController", "stream_scope"]

log = logging.getLogger("llama_server")

_OFFSET = re.compile(r"[0-9]+")


class _Entry(msgspec.Struct):
    """One session in a lookup answer (llama.cpp's key order)."""

    conversation_id: str
    is_done: bool
    total_bytes: int
    started_at: int
    completed_at: int


def _conv_id(request: Request[Any, Any, Any]) -> str:
    conv_id = request.query_params.get("conv_id") or ""
    if not conv_id:
        raise ApiError("Missing conversation id in path")
    return conv_id


def stream_scope(request: Request[Any, Any, Any], server: ServerState) -> str:
    """The caller's scope: its API key's ("" without keys). Sessions of other scopes do not exist for it."""
    return key_scope(server.config.api_keys, request.headers)


def _session(request: Request[Any, Any, Any], server: ServerState, conv_id: str) -> Session:
    session = server.streams.get(conv_id, stream_scope(request, server))
    if session is None:
        raise ApiError("Stream not found or expired", "not_found_error")
    return session


def _offset(request: Request[Any, Any, Any], session: Session) -> int:
    raw = request.query_params.get("from") or ""
    if raw and not _OFFSET.fullmatch(raw):
        raise ApiError("Invalid 'from' offset")
    offset = int(raw) if raw else 0
    if offset < session.dropped:
        raise ApiError("Stream offset lost, please restart")
    return offset


def _requested_ids(body: bytes) -> list[str]:
    """The non-empty string ids of `{"conversation_ids": [...]}`; anything else asks for nothing."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise _LookupError(f"invalid body: {e}") from None
    ids = data.get("conversation_ids") if isinstance(data, dict) else None
    return [i for i in ids if isinstance(i, str) and i] if isinstance(ids, list) else []


class _LookupError(Exception):
    pass


class StreamsController(Controller):
    """Resumable streams: replay and follow, look up by id, stop."""

    @get("/v1/stream")
    async def follow(self, request: Request, server: SharedState) -> EventStream:
        """The session's bytes from `from` on, then its live bytes until it is finalised."""
        session = _session(request, server, _conv_id(request))
        offset = _offset(request, session)
        reader = Reader(session, offset, server.config.stream_reader_wake, server.streams)
        return EventStream(Replay(reader), None)

    @post("/v1/streams/lookup", status_code=200)
    async def lookup(self, request: Request, server: SharedState) -> Response:
        """Only the sessions of the ids named (and their `<id>::<model>` variants): no enumeration."""
        try:
            ids = _requested_ids(await request.body())
        except _LookupError as e:  # llama.cpp's one error object without a `code`
            return json_response({"error": {"message": str(e), "type": "invalid_request_error"}}, 400)
        found = server.streams.lookup(ids, stream_scope(request, server))
        return json_response(
            [_Entry(s.conv_id, s.done, s.total_bytes, s.started_at, s.completed_at) for s in found]
        )

    @delete("/v1/stream", status_code=200)  # the answer is a 204 Response (with a content type)
    async def stop(self, request: Request, server: SharedState) -> Response:
        """Stop: the session is removed, its generation cancelled, its readers reach the end. Always 204."""
        conv_id = _conv_id(request)
        if server.streams.stop(conv_id, stream_scope(request, server)):
            log.info("stream %s stopped", short_id(conv_id))
        return Response(b"", status_code=204, media_type="application/json")
