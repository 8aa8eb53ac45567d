"""Server-Sent Events framing (endpoints.md §0.7) and JSON encoding of responses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar.response import Stream

__all__ = ["DONE", "PING", "encode", "event", "named_event", "sse_response"]

_encoder = msgspec.json.Encoder()  # non-finite floats become null, as the reference writes them
DONE = b"data: [DONE]\n\n"
PING = b":\n\n"


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


def event(obj: Any) -> bytes:
    """OAI framing: `data: <json>`."""
    return b"data: " + _encoder.encode(obj) + b"\n\n"


def named_event(name: str, obj: Any) -> bytes:
    """Anthropic / Responses framing: `event: <type>` then `data: <json>`."""
    return b"event: " + name.encode() + b"\ndata: " + _encoder.encode(obj) + b"\n\n"


def sse_response(body: AsyncIterator[bytes]) -> Stream:
    return Stream(
        body,
        media_type="text/event-stream",
        headers={"X-Accel-Buffering": "no", "Cache-Control": "no-cache"},
    )
