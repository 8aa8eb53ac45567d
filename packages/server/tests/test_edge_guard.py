"""The edge guard (llama_tools' guard.py) on a real `llama-server`: the routes that act on the machine
(`POST /tools`, slot files, `POST /props`, `POST /lora-adapters`, `/cors-proxy`) refuse what a page of
another site can send without a preflight (text/plain, no Content-Type, form-urlencoded with
`Origin: null`), foreign origins, and DNS-rebound Host names; nothing of such a request runs. What the web
UI, llama.cpp's tests and API clients send still works."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from conftest import Server, start_server, stop_server

KEY = "guard-test-key"
SMALL = ("-c", "128", "-np", "1", "--no-warmup")


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`--tools all` without --cors-origins (so `localhost`), slot files, POST /props and /cors-proxy."""
    tmp = tmp_path_factory.mktemp("guarded")
    (tmp / "work").mkdir()
    (tmp / "slots").mkdir()
    s = start_server(tmp, *SMALL, "--tools", "all", "--tools-dir", str(tmp / "work"), "--ui-mcp-proxy",
                     "--slot-save-path", str(tmp / "slots"), "--props")  # fmt: skip
    s.work = tmp / "work"  # type: ignore[attr-defined]
    s.slots = tmp / "slots"  # type: ignore[attr-defined]
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def gc(guarded: Server) -> Iterator[httpx.Client]:
    with guarded.client() as c:
        yield c


def _port(s: Server) -> int:
    return int(s.base_url.rsplit(":", 1)[1])


def _body(path: Path, text: str = "pwned") -> str:
    return f'{{"tool": "write_file", "params": {{"path": "{path}", "content": "{text}"}}}}'


def _refused(r: httpx.Response, status: int, word: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["code"] == status and word in err["message"], err
    assert err["type"] == ("permission_error" if status == 403 else "invalid_request_error")


@pytest.mark.parametrize(
    ("headers", "status", "word"),
    [
        ({"Content-Type": "text/plain"}, 415, "application/json"),
        ({"Content-Type": "text/plain;charset=UTF-8", "Origin": "https://evil.example"}, 403, "evil.example"),
        ({}, 415, "application/json"),  # a body without Content-Type
        ({"Content-Type": "application/x-www-form-urlencoded", "Origin": "null"}, 403, "null"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415, "application/json"),
        ({"Content-Type": "application/json", "Origin": "https://evil.example"}, 403, "evil.example"),
        ({"Content-Type": "application/json", "Origin": "http://localhost.evil.example"}, 403, "evil"),
        ({"Content-Type": "application/json", "Host": "evil.example:{port}"}, 403, "evil.example"),
        ({"Content-Type": "application/json", "Host": "127.0.0.1.nip.io:{port}"}, 403, "nip.io"),
    ],
)
def test_cross_site_write_file_refused(guarded, gc, headers, status, word):
    target = guarded.work / f"pwned-{uuid.uuid4().hex}.txt"
    headers = {k: v.format(port=_port(guarded)) for k, v in headers.items()}
    r = gc.post("/tools", content=_body(target), headers=headers)
    _refused(r, status, word)
    assert not target.exists()


def test_cross_site_shell_command_refused(guarded, gc):
    marker = guarded.work / "ran"
    body = f'{{"tool": "exec_shell_command", "params": {{"command": "touch {marker}"}}}}'
    for headers in (
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded", "Origin": "null"},
        {"Content-Type": "application/json", "Origin": "https://evil.example"},
        {"Content-Type": "application/json", "Host": f"evil.example:{_port(guarded)}"},
    ):
        assert gc.post("/tools", content=body, headers=headers).status_code in (403, 415)
    assert not marker.exists()
    # the same call as JSON from the machine itself runs
    r = gc.post("/tools", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert marker.exists()


def test_legitimate_tool_calls_work(guarded, gc):
    port = _port(guarded)
    cases = {
        "no-origin": {},  # curl, llama.cpp's tests, SDKs
        "localhost-origin": {"Origin": "http://localhost:5173"},  # a local dev server (`localhost`)
        "loopback-origin": {"Origin": "http://127.0.0.1:3000"},
        "same-origin": {"Origin": f"http://127.0.0.1:{port}"},  # the bundled web UI
        "same-origin-localhost": {"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"},
        "localhost-host": {"Host": f"LOCALHOST.:{port}"},
        "ipv4-host": {"Host": f"127.0.0.1:{port}"},
        "charset": {"Content-Type": "Application/JSON; charset=utf-8"},
    }
    for name, headers in cases.items():
        target = guarded.work / f"{name}.txt"
        r = gc.post(
            "/tools", content=_body(target, name), headers={"Content-Type": "application/json", **headers}
        )
        assert r.status_code == 200, (name, r.text)
        assert target.read_text() == name


def test_slot_files(guarded, gc):
    port = _port(guarded)
    save = "/slots/0?action=save"
    for headers, status in (
        ({"Content-Type": "text/plain"}, 415),
        ({}, 415),
        ({"Content-Type": "application/x-www-form-urlencoded", "Origin": "null"}, 403),
        ({"Content-Type": "application/json", "Origin": "https://evil.example"}, 403),
        ({"Content-Type": "application/json", "Host": f"evil.example:{port}"}, 403),
    ):
        r = gc.post(save, content=b'{"filename": "cross.bin"}', headers=headers)
        assert r.status_code == status, (headers, r.text)
    assert not (guarded.slots / "cross.bin").exists()
    r = gc.post(save, json={"filename": "own.bin"}, headers={"Origin": f"http://127.0.0.1:{port}"})
    assert r.status_code == 200, r.text
    assert (guarded.slots / "own.bin").is_file()
    # llama.cpp's test_slot_save_restore erases with no body and no Content-Type
    assert gc.post("/slots/0?action=erase").status_code == 200
    r = gc.post("/slots/0?action=erase", headers={"Origin": "https://evil.example"})
    _refused(r, 403, "evil.example")


def test_props_and_lora_adapters(guarded, gc):
    for path in ("/props", "/lora-adapters"):
        _refused(
            gc.post(path, content=b"{}", headers={"Content-Type": "text/plain"}), 415, "application/json"
        )
        r = gc.post(path, json={}, headers={"Origin": "https://evil.example"})
        _refused(r, 403, "evil.example")
    assert gc.post("/props", json={}).json() == {"success": True}


class _Target(BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


def test_cors_proxy_origin_and_host_only(guarded, gc):
    """`/cors-proxy` relays any body: only Host and Origin are checked."""
    target = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{target.server_port}/"
        port = _port(guarded)
        for method in ("GET", "POST"):
            r = gc.request(
                method, "/cors-proxy", params={"url": url}, headers={"Origin": "https://evil.example"}
            )
            _refused(r, 403, "evil.example")
            r = gc.request(
                method, "/cors-proxy", params={"url": url}, headers={"Host": f"evil.example:{port}"}
            )
            _refused(r, 403, "evil.example")
        assert _Target.hits == 0
        # a plain-text body from the server's own page is not the guard's to refuse (the proxy may still
        # refuse a loopback target: its own rule, with its own message)
        r = gc.post("/cors-proxy", params={"url": url}, content=b"x",
                    headers={"Content-Type": "text/plain", "Origin": f"http://127.0.0.1:{port}"})  # fmt: skip
        assert r.status_code != 415 and "not allowed (--cors-origins)" not in r.text, r.text
    finally:
        target.shutdown()
        target.server_close()


def test_unguarded_routes_and_web_ui(guarded, gc):
    port = _port(guarded)
    hostile = {"Origin": "https://evil.example", "Host": f"evil.example:{port}"}
    assert gc.get("/health", headers=hostile).status_code == 200
    assert gc.get("/health").status_code == 200
    assert gc.get("/", headers={"Host": f"127.0.0.1:{port}"}).status_code == 200
    assert gc.get("/tools").status_code == 200  # listing reads nothing of the machine
    r = gc.post("/tokenize", content=b'{"content": "hi"}', headers={"Content-Type": "text/plain"})
    assert r.status_code == 200  # not a route that acts on the machine: as llama.cpp
    pre = gc.options(
        "/tools", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    )
    assert pre.status_code == 200 and "access-control-allow-origin" not in pre.headers


@pytest.fixture(scope="module")
def literal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("literal")
    s = start_server(
        tmp, *SMALL, "--tools", "write_file", "--tools-dir", str(tmp), "--cors-origins", "https://app.example"
    )
    s.work = tmp  # type: ignore[attr-defined]
    yield s
    stop_server(s)


def test_literal_cors_origin(literal):
    port = _port(literal)
    with literal.client(headers={"Content-Type": "application/json"}) as c:
        for name, origin in (("app", "https://app.example"), ("same", f"http://127.0.0.1:{port}")):
            r = c.post(
                "/tools", content=_body(literal.work / f"{name}.txt", name), headers={"Origin": origin}
            )
            assert r.status_code == 200, (name, r.text)
        for origin in (
            "http://localhost:5173",
            "https://app.example.evil",
            f"http://127.0.0.1:{port + 1}",
            "null",
        ):
            target = literal.work / "refused.txt"
            r = c.post("/tools", content=_body(target), headers={"Origin": origin})
            _refused(r, 403, origin)
            assert not target.exists()
        pre = c.options(
            "/tools", headers={"Origin": "https://other.example", "Access-Control-Request-Method": "POST"}
        )
        assert pre.headers["access-control-allow-origin"] == "https://app.example"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("keyed")
    s = start_server(tmp, *SMALL, "--tools", "write_file", "--tools-dir", str(tmp), "--api-key", KEY)
    s.work = tmp  # type: ignore[attr-defined]
    yield s
    stop_server(s)


def test_api_key_skips_the_guard(keyed):
    """A request an API key authenticates is no cross-site one (a page cannot send the key without a
    preflight): any Content-Type, Origin and Host; without the key, 401 as before."""
    port = _port(keyed)
    hostile = {"Content-Type": "text/plain", "Origin": "https://evil.example", "Host": f"evil.example:{port}"}
    with keyed.client() as c:
        target = keyed.work / "keyed.txt"
        r = c.post("/tools", content=_body(target, "k"), headers=hostile)
        assert r.status_code == 401 and not target.exists()
        for auth in ({"Authorization": f"Bearer {KEY}"}, {"X-Api-Key": KEY}):
            target.unlink(missing_ok=True)
            r = c.post("/tools", content=_body(target, "k"), headers={**hostile, **auth})
            assert r.status_code == 200, r.text
            assert target.read_text() == "k"
        assert c.get("/health", headers=hostile).status_code == 200
