"""The route handlers in a bare Litestar app (as llama-router mounts them): status codes, flat error
bodies, streaming, the feature switch, and the CORS proxy against a loopback upstream."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from llama_tools import FEATURE_DISABLED, ToolsConfig, ToolsService, tools_route_handlers
from llama_tools.config import BUILTIN_TOOL_NAMES


def _client(config: ToolsConfig) -> TestClient:
    service = ToolsService(config)
    app = Litestar(route_handlers=tools_route_handlers(service), lifespan=[service.lifespan])
    return TestClient(app)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = str(tmp_path_factory.getbasetemp())  # every test's tmp_path is inside the tools directory
    # the upstreams below listen on loopback, which the proxy reaches only when allowed
    config = ToolsConfig(
        tools=BUILTIN_TOOL_NAMES, cors_proxy=True, cors_proxy_allow=("127.0.0.1",), root=root
    )
    with _client(config) as c:
        yield c


def test_disabled_is_403():
    with _client(ToolsConfig()) as c:
        for r in (c.get("/tools"), c.post("/tools", json={"tool": "read_file"}), c.get("/cors-proxy?url=x")):
            assert r.status_code == 403 and r.json() == FEATURE_DISABLED


def test_listing_order_and_subset():
    with _client(ToolsConfig(tools=("read_file", "get_info"))) as c:
        assert [t["tool"] for t in c.get("/tools").json()] == ["read_file", "get_info"]
        r = c.post("/tools", json={"tool": "exec_shell_command", "params": {"command": "true"}})
        assert r.status_code == 404  # not enabled: unknown here


def test_listing_shape(client):
    tools = client.get("/tools").json()
    assert [t["tool"] for t in tools] == list(BUILTIN_TOOL_NAMES)
    writes = {t["tool"] for t in tools if t["permissions"]["write"]}
    assert writes == {"exec_shell_command", "write_file", "edit_file"}
    for t in tools:
        assert t["type"] == "server" and t["definition"]["type"] == "function"
        assert t["definition"]["function"]["parameters"]["type"] == "object"


@pytest.mark.parametrize(
    ("body", "status", "code", "message"),
    [
        (b"{nope", 400, 400, "Invalid JSON"),
        (b"[1]", 400, 400, "must be a JSON object"),
        (b"{}", 400, 400, '"tool" is required'),
        (b'{"tool": 5}', 400, 400, '"tool" is required'),
        (b'{"tool": "read_file", "params": []}', 400, 400, '"params" must be an object'),
        (b'{"tool": "read_file", "params": {}}', 400, 400, 'missing required parameter "path"'),
        (b'{"tool": "read_file", "params": {"path": 1}}', 400, 400, "must be of type string"),
        (b'{"tool": "x"}', 404, 400, 'unknown tool "x"'),
        (
            b'{"tool": "read_file", "params": {"path": "a"}, "stream": true}',
            404,
            400,
            'tool "read_file" does not support stream = true',
        ),
    ],
)
def test_request_errors_are_flat(client, body, status, code, message):
    r = client.post("/tools", content=body)
    assert r.status_code == status
    err = r.json()
    assert set(err) == {"code", "message", "type"} and err["code"] == code
    assert err["type"] == "invalid_request_error" and message in err["message"]


def test_headers_override_params(client, tmp_path):
    (tmp_path / "m.txt").write_text("marker\n")
    r = client.post(
        "/tools",
        json={"tool": "read_file", "params": {"path": "m.txt", "cwd": "/nope", "resp_type": "base64"}},
        headers={"x-tool-cwd": str(tmp_path)},
    )
    assert r.json() == {"plain_text_response": "marker\n"}  # model-supplied cwd and resp_type are stripped
    r = client.post("/tools", json={"tool": "read_file", "params": {"path": "m.txt"}},
                    headers={"X-Tool-Cwd": str(tmp_path), "X-Resp-Type": "base64"})  # fmt: skip
    assert r.json() == {"base64": "bWFya2VyCg==", "size_bytes": 7}
    # a model-supplied runtime is stripped too: the call runs on the host, not in a made-up isolate
    r = client.post("/tools", json={"tool": "get_info", "params": {"runtime": "fake:x"}})
    assert r.status_code == 200 and "os" in r.json()


def test_runtime_header_errors_are_500(client):
    for spec, message in [("fake:x", "unknown tool runtime: fake:x"), ("ssh:-oProxyCommand=x", "invalid ssh target"),
                          ("docker-container:--privileged", "invalid container id: --privileged")]:  # fmt: skip
        r = client.post("/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hi"}},
                        headers={"x-tool-runtime": spec})  # fmt: skip
        assert r.status_code == 500
        assert r.json()["type"] == "server_error" and message in r.json()["message"]


def test_stream(client):
    with client.stream("POST", "/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hello"},
                                               "stream": True}) as r:  # fmt: skip
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == {"done": True}
    assert "".join(e["chunk"] for e in events[:-1]) == "hello\n\n[exit code: 0]"
    # a failing stream ends with done + error (no [DONE] sentinel)
    with client.stream("POST", "/tools", json={"tool": "exec_shell_command", "params": {"command": "true"},
                                               "stream": True}, headers={"x-tool-runtime": "ssh:ok-host"}) as r:  # fmt: skip
        body = r.read().decode()
    assert body.startswith("data: ") and "[DONE]" not in body
    assert json.loads(body.strip().split("\n")[-1][6:])["done"] is True


class _Upstream(BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.seen = dict(self.headers)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Access-Control-Allow-Origin", "https://upstream.example")
        self.send_header("X-Upstream", "yes")
        self.end_headers()
        self.wfile.write(b"ok")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.server.body = self.rfile.read(length)  # type: ignore[attr-defined]
        self.send_response(204 if self.path == "/empty" else 201)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_proxy_headers_status_body(client, upstream):
    base = f"http://127.0.0.1:{upstream.server_port}"
    r = client.get(f"/cors-proxy?url={base}/capture", headers={
        "Authorization": "Bearer secret", "Cookie": "session=secret", "X-Api-Key": "k",
        "Proxy-Authorization": "Basic x", "x-llama-server-proxy-header-accept": "application/json",
        "x-llama-server-proxy-header-authorization": "Bearer explicit"})  # fmt: skip
    assert r.status_code == 200 and r.text == "ok" and r.headers["x-upstream"] == "yes"
    assert "access-control-allow-origin" not in r.headers
    seen = {k.lower(): v for k, v in upstream.seen.items()}  # type: ignore[attr-defined]
    assert seen["accept"] == "application/json" and seen["authorization"] == "Bearer explicit"
    assert not {"cookie", "x-api-key", "proxy-authorization"} & set(seen)
    r = client.post(f"/cors-proxy?url={base}/empty", content=b'{"a": 1}')
    assert r.status_code == 204 and r.content == b""
    assert upstream.body == b'{"a": 1}'  # type: ignore[attr-defined]
    assert client.post(f"/cors-proxy?url={base}/made", content=b"x").status_code == 201


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://127.0.0.1/x", "unsupported URL scheme in target URL: ftp"),
        ("http://user:pw@127.0.0.1/", "authentication in target URL is not supported"),
        ("/relative", "invalid target URL: missing host"),
        ("", "invalid target URL: missing host"),
        ("http://[::1/", "invalid target URL"),
        ("http://127.0.0.1:80x/", "invalid target URL"),
    ],
)
def test_proxy_refuses(client, url, message):
    r = client.get("/cors-proxy", params={"url": url})
    assert r.status_code == 500 and message in r.json()["error"]["message"]


def test_proxy_network_failure(client):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    r = client.get(f"/cors-proxy?url=http://127.0.0.1:{port}/")
    assert r.status_code == 500 and r.text.startswith("proxy error: ")
