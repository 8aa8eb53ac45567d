"""The edge guard of the routes that act on the machine (guard.py): Host and Origin parsing, the names a
server listens on, and the checks in their order. The same guard on real servers: llama-server's
tests/test_edge_guard.py and llama-router's tests/test_edge_guard_router.py."""

from __future__ import annotations

import pytest
from llama_tools import CorsPolicy, RequestGuard, guard_kind
from llama_tools.guard import GUARD_FULL, GUARD_ORIGIN, is_ip_literal, origin_parts, split_host


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("[::1]:8080", ("::1", 8080)),
        ("[::1]", ("::1", None)),
        ("[0:0:0:0:0:0:0:1]:80", ("::1", 80)),  # compressed
        ("::1", ("::1", None)),  # without brackets (and so without a port)
        ("LOCALHOST.", ("localhost", None)),
        ("LocalHost.:8080", ("localhost", 8080)),
        ("evil.example", ("evil.example", None)),
        ("evil.example:8080", ("evil.example", 8080)),
        ("127.0.0.1.nip.io", ("127.0.0.1.nip.io", None)),
        ("0x7f.1", ("0x7f.1", None)),
        ("[fe80::1%25eth0]:8080", ("fe80::1", 8080)),  # the zone id of RFC 6874, dropped
        ("[fe80::1%eth0]", ("fe80::1", None)),
        ("host:", ("host", None)),  # an empty port is allowed by RFC 3986
        ("[::1]:", ("::1", None)),
        ("", ("", None)),
        ("   ", ("", None)),
    ],
)
def test_split_host(value, parsed):
    assert split_host(value) == parsed


@pytest.mark.parametrize(
    "value",
    [
        "[::1",
        "[::1]x",
        "[evil.example]",
        "[127.0.0.1]",
        "[v1.fe]",
        ":8080",
        "a b",
        "evil.example:80:80",
        "localhost:99999",
        "localhost:-1",
        "localhost:８0",  # digits, but not ASCII ones
        "évil.example",
        "user@localhost",
        "localhost/path",
        "localhost..",
        "..",
        ".",
        "1:2:3",  # colons, but no IPv6 address
    ],
)
def test_split_host_malformed(value):
    assert split_host(value) is None


@pytest.mark.parametrize(
    ("host", "literal"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("fe80::1", True),
        ("10.1.2.3", True),
        ("0x7f.1", False),  # inet_aton's shorthands are names here: a browser writes the dotted quad
        ("127.1", False),
        ("2130706433", False),
        ("127.0.0.1.nip.io", False),
        ("localhost", False),
        ("", False),
    ],
)
def test_is_ip_literal(host, literal):
    assert is_ip_literal(host) is literal


@pytest.mark.parametrize(
    ("origin", "parts"),
    [
        ("http://localhost", ("http", "localhost", 80)),
        ("https://App.Example", ("https", "app.example", 443)),
        ("http://[::1]:3000", ("http", "::1", 3000)),
        ("http://127.0.0.1:8080/", ("http", "127.0.0.1", 8080)),
        ("null", None),
        ("localhost", None),
        ("http://", None),
        ("http://a/b", None),
        ("http://u:p@a", None),
        ("http://[::1", None),
        ("http://a:99999", None),
        ("chrome-extension://abc", None),  # no port of its own
    ],
)
def test_origin_parts(origin, parts):
    assert origin_parts(origin) == parts


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("POST", "/tools", GUARD_FULL),
        ("POST", "/tools/", GUARD_FULL),
        ("POST", "//tools", GUARD_FULL),
        ("POST", "/v1/../tools", GUARD_FULL),
        ("POST", "/slots/0", GUARD_FULL),
        ("POST", "/lora-adapters", GUARD_FULL),
        ("POST", "/props", GUARD_FULL),
        ("POST", "/models", GUARD_FULL),
        ("POST", "/models/load", GUARD_FULL),
        ("POST", "/models/unload", GUARD_FULL),
        ("DELETE", "/models", GUARD_FULL),
        ("GET", "/cors-proxy", GUARD_ORIGIN),
        ("POST", "/cors-proxy", GUARD_ORIGIN),
        ("OPTIONS", "/tools", None),
        ("GET", "/tools", None),
        ("GET", "/slots", None),
        ("GET", "/props", None),
        ("POST", "/v1/chat/completions", None),
        ("POST", "/completion", None),
        ("GET", "/health", None),
        ("DELETE", "/v1/stream", None),
    ],
)
def test_guard_kind(method, path, kind):
    assert guard_kind(method, path) == kind


def _headers(**kw: str) -> list[tuple[bytes, bytes]]:
    return [(k.replace("_", "-").encode(), v.encode("latin-1")) for k, v in kw.items()]


def _check(guard, method="POST", path="/tools", **kw):
    r = guard.check(method, path, _headers(**kw))
    return None if r is None else (r.status, r.type)


LOCAL = RequestGuard(CorsPolicy("localhost"), "127.0.0.1", names=lambda: {"should-not-be-used"})
JSON = {"content_type": "application/json", "content_length": "2"}
FORBIDDEN = (403, "permission_error")
REFUSED_TYPE = (415, "invalid_request_error")


def test_loopback_server_names():
    assert LOCAL.names == {"localhost"}  # bound to loopback: no machine names
    named = RequestGuard(CorsPolicy(), "my-box.lan", names=lambda: {"box"})
    assert named.names == {"localhost", "my-box.lan", "box"}
    for wildcard in ("0.0.0.0", "::", "[::]", "127.0.0.1,0.0.0.0", "10.0.0.5"):
        assert "box" in RequestGuard(CorsPolicy(), wildcard, names=lambda: {"box"}).names, wildcard
    assert RequestGuard(CorsPolicy(), "::1", names=lambda: {"box"}).names == {"localhost"}


@pytest.mark.parametrize(
    ("host", "result"),
    [
        ("127.0.0.1:8080", None),
        ("localhost:8080", None),
        ("LOCALHOST.:8080", None),
        ("[::1]:8080", None),
        ("192.168.1.20:8080", None),  # any IP literal: rebinding goes through a name
        ("evil.example:8080", FORBIDDEN),
        ("127.0.0.1.nip.io:8080", FORBIDDEN),
        ("0x7f.1:8080", FORBIDDEN),
        ("should-not-be-used", FORBIDDEN),
        ("[::1", FORBIDDEN),
        ("", None),  # an empty Host is no Host
    ],
)
def test_host(host, result):
    assert _check(LOCAL, host=host, **JSON) == result


def test_host_missing_repeated_and_unix_socket():
    assert _check(LOCAL, **JSON) is None
    two = [(b"host", b"127.0.0.1"), (b"host", b"evil.example"), *_headers(**JSON)]
    assert LOCAL.check("POST", "/tools", two) is not None
    unix = RequestGuard(CorsPolicy("localhost"), "/tmp/llama.sock")
    assert _check(unix, host="evil.example", **JSON) is None  # no browser reaches a Unix socket


@pytest.mark.parametrize(
    ("origin", "result"),
    [
        ("http://localhost", None),
        ("http://localhost:5173", None),
        ("http://127.0.0.1:3000", None),
        ("http://[::1]:3000", None),
        ("null", FORBIDDEN),
        ("NULL", FORBIDDEN),
        ("https://evil.example", FORBIDDEN),
        ("http://localhost.evil.example", FORBIDDEN),
        ("http://127.0.0.1.nip.io:8080", FORBIDDEN),
    ],
)
def test_origin_localhost_policy(origin, result):
    assert _check(LOCAL, host="127.0.0.1:8080", origin=origin, **JSON) == result


def test_origin_literal_policy_and_same_origin():
    g = RequestGuard(CorsPolicy("https://app.example"), "0.0.0.0", names=lambda: {"box"})
    assert _check(g, host="box:8080", origin="https://app.example", **JSON) is None
    assert _check(g, host="box:8080", origin="HTTPS://App.Example:443/", **JSON) is None
    assert _check(g, host="box:8080", origin="https://app.example:8443", **JSON) == FORBIDDEN
    assert _check(g, host="box:8080", origin="http://localhost:8080", **JSON) == FORBIDDEN
    # the server's own pages: the Origin's host and port are the Host header's
    assert _check(g, host="box:8080", origin="http://box:8080", **JSON) is None
    assert _check(g, host="BOX.:8080", origin="http://box:8080", **JSON) is None
    assert _check(g, host="10.0.0.5:8080", origin="http://10.0.0.5:8080", **JSON) is None
    assert _check(g, host="[::1]:8080", origin="http://[::1]:8080", **JSON) is None
    assert _check(g, host="box", origin="http://box", **JSON) is None  # default ports
    assert _check(g, host="box", origin="https://box", **JSON) is None
    assert _check(g, host="box:80", origin="http://box", **JSON) is None
    assert _check(g, host="box:8080", origin="http://box:8081", **JSON) == FORBIDDEN
    assert _check(g, host="box", origin="http://box:8080", **JSON) == FORBIDDEN
    assert _check(g, host="box:8080", origin="http://10.0.0.5:8080", **JSON) == FORBIDDEN
    assert _check(g, origin="http://box:8080", **JSON) == FORBIDDEN  # no Host: nothing to be same as
    assert _check(g, host="box:8080", origin="null", **JSON) == FORBIDDEN
    # a rebound name fails the Host check before its Origin could look like the server's own
    assert _check(g, host="evil.example:8080", origin="http://evil.example:8080", **JSON) == FORBIDDEN


def test_origin_star_policy():
    g = RequestGuard(CorsPolicy("*"), "127.0.0.1")
    assert _check(g, host="127.0.0.1:8080", origin="https://anything.example", **JSON) is None
    assert _check(g, host="127.0.0.1:8080", origin="null", **JSON) == FORBIDDEN
    # Content-Type and Host still apply
    assert _check(g, host="127.0.0.1:8080", content_type="text/plain", content_length="2") == REFUSED_TYPE
    assert _check(g, host="evil.example:8080", **JSON) == FORBIDDEN


@pytest.mark.parametrize(
    ("headers", "result"),
    [
        ({"content_type": "application/json"}, None),
        ({"content_type": "Application/JSON; charset=utf-8"}, None),
        ({"content_type": " application/json ;charset=UTF-8", "content_length": "9"}, None),
        ({}, None),  # no body (`POST /slots/1?action=erase`), no Content-Type
        ({"content_length": "0"}, None),
        ({"content_length": "2"}, REFUSED_TYPE),
        ({"transfer_encoding": "chunked"}, REFUSED_TYPE),
        ({"content_type": "text/plain", "content_length": "2"}, REFUSED_TYPE),
        ({"content_type": "text/plain;charset=UTF-8"}, REFUSED_TYPE),
        ({"content_type": "application/x-www-form-urlencoded"}, REFUSED_TYPE),
        ({"content_type": "multipart/form-data; boundary=x"}, REFUSED_TYPE),
        ({"content_type": "application/jsonx"}, REFUSED_TYPE),
        ({"content_type": "application/json-patch+json"}, REFUSED_TYPE),
        ({"content_type": "", "content_length": "2"}, REFUSED_TYPE),
    ],
)
def test_content_type(headers, result):
    assert _check(LOCAL, host="127.0.0.1:8080", **headers) == result


def test_repeated_content_type_must_all_be_json():
    raw = [(b"content-type", b"application/json"), (b"content-type", b"text/plain")]
    assert LOCAL.check("POST", "/tools", raw) is not None


def test_cors_proxy_needs_no_json():
    plain = {"content_type": "text/plain", "content_length": "2"}
    for method in ("GET", "POST"):
        assert _check(LOCAL, method, "/cors-proxy", host="127.0.0.1:1", **plain) is None
        assert _check(LOCAL, method, "/cors-proxy", host="evil.example", **plain) == FORBIDDEN
        r = _check(LOCAL, method, "/cors-proxy", origin="https://evil.example", **plain)
        assert r == FORBIDDEN


def test_unguarded_routes_pass_anything():
    hostile = {"host": "evil.example", "origin": "null", "content_type": "text/plain", "content_length": "2"}
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/tools"), ("OPTIONS", "/tools")):
        assert _check(LOCAL, method, path, **hostile) is None


def test_order_and_messages():
    r = LOCAL.check(
        "POST", "/tools", _headers(host="evil.example:1", origin="null", content_type="text/plain")
    )
    assert r is not None and r.status == 403 and "evil.example" in r.message  # Host first
    r = LOCAL.check("POST", "/tools", _headers(origin="https://evil.example", content_type="text/plain"))
    assert r is not None and r.status == 403 and "https://evil.example" in r.message  # then Origin
    r = LOCAL.check("POST", "/tools", _headers(content_type="text/plain"))
    assert r is not None and r.status == 415 and "application/json" in r.message
    assert r.body() == {"error": {"code": 415, "message": r.message, "type": "invalid_request_error"}}


@pytest.mark.parametrize(
    ("policy", "origin", "allowed"),
    [
        ("*", "https://x.example", True),
        ("*", "", False),
        ("localhost", "http://localhost:1", True),
        ("localhost", "https://[::1]", True),
        ("localhost", "http://localhost.evil.example", False),
        ("https://app.example", "https://app.example", True),
        ("https://app.example/", "https://app.example", True),
        ("https://app.example", "http://app.example", False),
        ("https://app.example", "https://app.example.evil", False),
        ("web.mydomain.fr", "web.mydomain.fr", True),  # not a URL: compared as written
        ("web.mydomain.fr", "other", False),
    ],
)
def test_cors_policy_allows(policy, origin, allowed):
    assert CorsPolicy(policy).allows(origin) is allowed
