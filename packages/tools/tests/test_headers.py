"""Header names in canonical case (headers.py): the spelling, and the names that a protocol's `lower()`
leaves canonical while its own checks still see lower case. On a real router behind uvicorn's httptools
protocol: the router's test_edge_guard_router.py."""

from __future__ import annotations

import pytest
from llama_tools.headers import CanonicalName, canonical_name, wire_name


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        (b"content-type", b"Content-Type"),
        (b"access-control-allow-origin", b"Access-Control-Allow-Origin"),
        (b"ACCESS-CONTROL-ALLOW-ORIGIN", b"Access-Control-Allow-Origin"),
        (b"server", b"Server"),
        (b"etag", b"ETag"),
        (b"www-authenticate", b"WWW-Authenticate"),
        (b"x-accel-buffering", b"X-Accel-Buffering"),
    ],
)
def test_canonical_name(name, canonical):
    assert canonical_name(name) == canonical
    assert wire_name(name) == canonical and bytes(wire_name(name)) == canonical


def test_wire_name_survives_a_protocols_lower_and_checks():
    name = wire_name(b"content-length")
    lowered = name.lower()  # uvicorn's httptools protocol: `name = name.lower()`
    assert lowered is name and bytes(lowered) == b"Content-Length"
    assert lowered == b"content-length"
    assert [b"content-length"].count(lowered) == 1  # the subclass's comparison wins on either side
    assert lowered in (b"content-length", b"transfer-encoding")
    assert lowered != b"content-type" and lowered != "content-length"
    assert {b"content-length": 1}[lowered] == 1  # hashed as the lower-case name
    assert b"".join([lowered, b": ", b"3"]) == b"Content-Length: 3"  # what goes out
    assert isinstance(lowered, CanonicalName) and wire_name(b"Content-Length") == lowered
    assert bytes.lower(lowered) == b"content-length"  # a protocol that lowers otherwise: lower case again
