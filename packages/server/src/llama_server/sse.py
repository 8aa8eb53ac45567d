"""Server-Sent Events framing (endpoints.md §0.7) and JSON encoding of responses.

OAI framing is `data: <json>\\n\\n`; named-event framing (Anthropic, Responses) is `event: <type>\\n` before
it, where `<type>` is the Struct's tag, so an event's name and its data's `type` are the same string.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["DONE", "PING", "encode", "event", "named_event", "write_event"]

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


def write_event(buf: bytearray, obj: msgspec.Struct, named: bool) -> None:
    """Append one event to `buf`, the JSON encoded in place (no intermediate bytes per event)."""
    if named:
        buf += b"event: "
        buf += type(obj).__struct_config__.tag.encode()  # type: ignore[union-attr]
        buf += b"\n"
    buf += b"data: "
    _encoder.encode_into(obj, buf, len(buf))
    buf += b"\n\n"
