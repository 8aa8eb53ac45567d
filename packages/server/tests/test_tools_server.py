"""`/tools`, MCP servers and `/cors-proxy` on a real llama-server process (streams-and-tools.md §2-§4),
with llama.cpp's own MCP fixture servers beside ours (the cases of its test_tools_builtin.py,
test_mcp_servers.py, test_proxy.py)."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from conftest import LLAMA_CPP_SRC, Server, smollm2_path, start_server, stop_server
from llama_tools.config import BUILTIN_TOOL_NAMES

KEY = "tools-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
OURS = str(Path(__file__).parents[2] / "tools" / "tests" / "mcp_test_server.py")
FIXTURES = LLAMA_CPP_SRC / "tools" / "server" / "tests" / "fixtures"
DISABLED = {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}


def _mcp(**servers: list[str]) -> str:
    return json.dumps({"mcpServers": {n: {"command": sys.executable, "args": a} for n, a in servers.items()}})


@pytest.fixture(scope="module")
def tools_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("tools")
    servers = _mcp(
        echo=[str(FIXTURES / "mcp_echo_server.py")],
        burst=[str(FIXTURES / "mcp_burst_server.py")],
        notifying=[str(FIXTURES / "mcp_malformed_server.py")],
        crash=[str(FIXTURES / "mcp_crash_server.py")],
        t=[OURS],
    )
    bad = {"nonexistent": {"command": "this_executable_does_not_exist_12345", "args": []}}
    config = tmp / "more.json"
    config.write_text(json.dumps({"mcpServers": bad}))
    # `--tools-dir /`: anywhere, as llama.cpp (its cases use absolute paths all over the machine);
    # the default confinement is tested below
    # `--cors-proxy-allow 127.0.0.1`: the proxy cases reach an upstream and this server on loopback
    s = start_server(tmp, "-c", "256", "-np", "1", "--tools", "all", "--tools-dir", "/", "--ui-mcp-proxy", "--api-key", KEY,
                     "--cors-proxy-allow", "127.0.0.1",
                     "--mcp-servers-config", str(config), "--mcp-servers-json", servers)  # fmt: skip
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def tc(tools_server: Server) -> Iterator[httpx.Client]:
    with tools_server.client(headers=AUTH) as c:
        yield c


def call(c: httpx.Client, tool: str, params: dict, headers: dict | None = None) -> dict:
    r = c.post("/tools", json={"tool": tool, "params": params}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def test_off_by_default(client):
    for r in (
        client.get("/tools"),
        client.post("/tools", json={"tool": "read_file"}),
        client.get("/cors-proxy"),
    ):
        assert r.status_code == 403 and r.json() == DISABLED
    assert client.get("/props").json()["cors_proxy_enabled"] is False


def test_listing(tc):
    tools = tc.get("/tools").json()
    names = [t["tool"] for t in tools]
    assert names[:7] == list(BUILTIN_TOOL_NAMES)
    assert {"echo_echo", "echo_add", "echo_fail_once", "burst_echo", "notifying_echo", "t_echo"} <= set(names)
    assert not any(n.startswith("nonexistent_") for n in names)  # a server that fails to start adds nothing
    echo = next(t for t in tools if t["tool"] == "echo_echo")
    assert echo["type"] == "mcp" and echo["definition"]["function"]["parameters"]["required"] == ["message"]
    assert tc.get("/props").json()["cors_proxy_enabled"] is True
    assert httpx.get(tc.base_url.join("/tools")).status_code == 401  # the API key applies


def test_builtin_round_trip(tc, tmp_path):
    log = str(tmp_path / "test.log")
    assert (
        call(tc, "write_file", {"path": log, "content": "line1\nline2\nline3\n"})["result"]
        == "file written successfully"
    )
    edits = [
        {"old_text": "line2", "new_text": "line2-edited"},
        {"old_text": "line3\n", "new_text": "line3\nline4\n"},
    ]
    assert call(tc, "edit_file", {"path": log, "edits": edits})["edits_applied"] == 2
    assert call(tc, "read_file", {"path": log}) == {
        "plain_text_response": "line1\nline2-edited\nline3\nline4\n"
    }
    assert (
        "unique"
        in call(tc, "edit_file", {"path": log, "edits": [{"old_text": "line", "new_text": "x"}]})["error"]
    )
    # this very file, found by grep with a bare include pattern
    res = call(tc, "grep_search", {"path": str(Path(__file__).parent), "pattern": "tools_marker_7f3a",
                                   "include": "test_tools_server.py"})  # fmt: skip
    assert "Total matches: 1" in res["plain_text_response"]  # tools_marker_7f3a


def test_cwd_header(tc, tmp_path):
    (tmp_path / "rel.txt").write_text("relative-content")
    h = {"x-tool-cwd": str(tmp_path)}
    assert (
        "relative-content"
        in call(tc, "read_file", {"path": "rel.txt", "cwd": "/not/real"}, h)["plain_text_response"]
    )
    call(tc, "exec_shell_command", {"command": "echo hello > marker.txt"}, h)
    assert (tmp_path / "marker.txt").read_text() == "hello\n"
    assert (
        "rel.txt" in call(tc, "file_glob_search", {"path": ".", "include": "*.txt"}, h)["plain_text_response"]
    )
    assert call(tc, "get_info", {}, h)["cwd"] == str(tmp_path)


def test_stream_and_disconnect_kills(tc, tmp_path):
    body = {"tool": "exec_shell_command", "params": {"command": "echo hello"}, "stream": True}
    with tc.stream("POST", "/tools", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == {"done": True} and "hello" in "".join(e["chunk"] for e in events[:-1])
    pid_file = tmp_path / "pid"
    body = {"tool": "exec_shell_command", "params": {"command": f"echo $$ > {pid_file}; echo go; sleep 50",
                                                     "timeout": 60}, "stream": True}  # fmt: skip
    with tc.stream("POST", "/tools", json=body) as r:
        for line in r.iter_lines():
            if "go" in line:
                break  # the client goes away mid-command
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), "the command outlived its client"


def test_status_codes(tc):
    r = tc.post("/tools", json={"tool": "nope"})
    assert r.status_code == 404 and r.json() == {"code": 400, "message": 'unknown tool "nope"',
                                                 "type": "invalid_request_error"}  # fmt: skip
    r = tc.post("/tools", json={"tool": "read_file", "params": {"path": "x"}, "stream": True})
    assert r.status_code == 404 and "does not support stream = true" in r.json()["message"]
    r = tc.post("/tools", json={"tool": "echo_echo", "params": {"message": "x"}, "stream": True})
    assert r.status_code == 404
    r = tc.post("/tools", content=b"not json")
    assert r.status_code == 400 and r.json()["type"] == "invalid_request_error" and "error" not in r.json()
    for runtime, message in [("fake:does-not-exist", "unknown tool runtime"),
                             ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target"),
                             ("docker-container:--privileged", "invalid container id"),
                             ("podman-container:--privileged", "invalid container id")]:  # fmt: skip
        r = tc.post("/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hi"}},
                    headers={"x-tool-runtime": runtime})  # fmt: skip
        assert r.status_code == 500 and message in r.json()["message"], r.text


def test_mcp_calls(tc):
    assert call(tc, "echo_echo", {"message": "hello world"}) == {"plain_text_response": "echo: hello world"}
    assert call(tc, "echo_add", {"a": 3, "b": 5}) == {"plain_text_response": "8"}
    assert call(tc, "echo_fail_once", {}) == {"error": "transient error"}
    assert call(tc, "echo_fail_once", {}) == {"plain_text_response": "ok"}
    assert call(tc, "burst_echo", {"message": "burst test"}) == {"plain_text_response": "echo: burst test"}
    assert call(tc, "notifying_echo", {"message": "hi"}) == {"plain_text_response": "echo: hi"}
    assert call(tc, "crash_echo", {"message": "hi"}) == {"plain_text_response": "echo: hi"}
    assert call(tc, "t_notify", {"message": "n"}) == {"plain_text_response": "notified: n"}
    assert "error" in call(tc, "t_fail", {"message": "bad"})
    for i in range(20):
        assert call(tc, "echo_echo", {"message": f"msg{i}"}) == {"plain_text_response": f"echo: msg{i}"}
    with ThreadPoolExecutor(max_workers=10) as pool:
        results = list(pool.map(lambda i: call(tc, "echo_echo", {"message": str(i)}), range(10)))
    assert results == [{"plain_text_response": f"echo: {i}"} for i in range(10)]


def test_mcp_crash_then_respawn(tc):
    assert call(tc, "t_crash", {}) == {"error": "transport closed"}
    assert call(tc, "t_echo", {"message": "back"}) == {"plain_text_response": "echo: back"}
    assert tc.get("/health").status_code == 200


class _NoContent(BaseHTTPRequestHandler):
    def do_POST(self):
        self.send_response(204)
        self.end_headers()

    def do_GET(self):
        self.server.seen = dict(self.headers)  # type: ignore[attr-defined]
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _NoContent)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_cors_proxy(tc, upstream):
    base = f"http://127.0.0.1:{upstream.server_port}"
    r = tc.post(f"/cors-proxy?url={base}/", json={})
    assert r.status_code == 204 and r.content == b""
    r = tc.get(f"/cors-proxy?url={base}/capture", headers={
        "Proxy-Authorization": "Basic secret", "X-Api-Key": KEY, "Cookie": "session=secret",
        "x-llama-server-proxy-header-accept": "application/json",
        "x-llama-server-proxy-header-authorization": "Bearer explicit"})  # fmt: skip
    assert r.status_code == 200 and r.text == "ok"
    seen = {k.lower(): v for k, v in upstream.seen.items()}  # type: ignore[attr-defined]
    assert seen["accept"] == "application/json" and seen["authorization"] == "Bearer explicit"
    assert not {"proxy-authorization", "x-api-key", "cookie"} & set(seen)
    # the server's own API through the proxy (the key travels only as an explicit proxy header)
    r = tc.get(
        f"/cors-proxy?url={tc.base_url}/models",
        headers={"x-llama-server-proxy-header-authorization": AUTH["Authorization"]},
    )
    assert r.status_code == 200 and "data" in r.json(), (str(tc.base_url), r.text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--tools", "read_file,bogus"],
            'unknown tool "bogus". available tools: read_file, file_glob_search',
        ),
        (["--tools", "all", "--mcp-servers-json", "not valid json"], "failed to parse MCP config JSON"),
        (
            ["--mcp-servers-config", "/nonexistent/path.json"],
            "failed to open MCP config file: /nonexistent/path.json",
        ),
        (["--tools", "all", "--tools-runtime", "docker:busybox"], "docker is not installed"),
        (["--tools", "all", "--tools-runtime", "ssh:-oProxyCommand=x"], "invalid ssh target"),
        (["--tools", "all", "--tools-runtime", "docker-container:--privileged"], "invalid container id"),
    ],
)
def test_start_up_errors(tmp_path, monkeypatch, args, message):
    """Each aborts start-up with its message before the model is loaded (the command line, in-process)."""
    from click.testing import CliRunner

    from llama_server.cli import main

    monkeypatch.setenv("PATH", str(tmp_path))  # no docker here, whatever the machine has
    result = CliRunner().invoke(main, ["-m", str(smollm2_path()), "--port", "0", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_sigterm_with_a_slow_call_and_a_grandchild(tmp_path):
    """SIGTERM during a 10 s MCP call (llama.cpp's test_mcp_slow_tool_call_slot_release): the call is
    answered at once (`cancelled`), the grandchild holding its server's pipes stalls nothing, and the
    server exits within llama.cpp's 3 s."""
    servers = {
        "slow": {"command": sys.executable, "args": [str(FIXTURES / "mcp_slow_server.py"), "--delay", "10"]},
        "gc": {"command": sys.executable, "args": [str(FIXTURES / "mcp_grandchild_server.py")]},
    }
    s = start_server(
        tmp_path, "-c", "256", "-np", "1", "--mcp-servers-json", json.dumps({"mcpServers": servers})
    )
    answered: dict[str, float] = {}
    try:
        with s.client() as c:
            assert call(c, "gc_echo", {"message": "hello"}) == {"plain_text_response": "echo: hello"}

            def slow() -> httpx.Response:
                r = c.post("/tools", json={"tool": "slow_sleep", "params": {"seconds": 10}})
                answered["at"] = time.monotonic()
                return r

            with ThreadPoolExecutor(max_workers=1) as pool:
                pending = pool.submit(slow)
                time.sleep(1.5)
                start = time.monotonic()
                s.proc.send_signal(signal.SIGTERM)
                s.proc.wait(timeout=15)
                elapsed = time.monotonic() - start
                res = pending.result(timeout=5)
        assert res.status_code == 200 and res.json() == {"error": "cancelled"}, res.text
        assert answered["at"] - start < 1.5, "the call in flight was not ended by the shutdown"
        assert elapsed < 3, f"shutdown took {elapsed:.2f} s"
        print(f"SIGTERM to exit: {elapsed:.2f} s")
    finally:
        if s.proc.poll() is None:
            stop_server(s)


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost",
        "http://localhost:8080",
        "http://127.0.0.1",
        "http://127.0.0.1:3000",
        "http://[::1]",
        "http://[::1]:3000",
    ],
)
def test_cors_defaults_to_localhost_with_tools_reflects(tc, origin):
    r = tc.options("/completions", headers={"Origin": origin, **PREFLIGHT})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == origin
    assert tc.get("/health", headers={"Origin": origin}).headers["access-control-allow-origin"] == origin


@pytest.mark.parametrize(
    "origin",
    ["http://web.mydomain.fr", "http://evil.com", "http://notlocalhost", "http://localhost.evil.com"],
)
def test_cors_defaults_to_localhost_with_tools_rejects(tc, origin):
    r = tc.options("/completions", headers={"Origin": origin, **PREFLIGHT})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    r = tc.post("/tools", json={"tool": "get_info"}, headers={"Origin": origin})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


# hostile tool parameters (the hostile matrix, for /tools): each gets a tool error (200 with "error"), a flat
# 4xx/5xx, or a bounded result, fast; and the server keeps serving
HERE = str(Path(__file__).parents[1])
HOSTILE: list[tuple[str, str, dict, dict, str]] = [
    ("read-dev-zero", "read_file", {"path": "/dev/zero", "end_line": 1}, {}, "error"),
    ("read-dev-zero-base64", "read_file", {"path": "/dev/zero"}, {"x-resp-type": "base64"}, "error"),
    ("read-proc-mem", "read_file", {"path": "/proc/self/mem", "end_line": 1}, {}, "error"),
    ("read-directory", "read_file", {"path": "/"}, {}, "error"),
    ("read-nul-in-path", "read_file", {"path": "a\u0000b"}, {}, "error"),
    ("read-path-100k", "read_file", {"path": "a/" * 50_000}, {}, "error"),
    (
        "read-traversal-missing",
        "read_file",
        {"path": "../" * 40 + "no/such/file"},
        {"x-tool-cwd": "/tmp"},
        "error",
    ),
    ("read-huge-lines", "read_file", {"path": __file__, "start_line": 2**62, "end_line": 2**63}, {}, "ok"),
    ("read-negative-lines", "read_file", {"path": __file__, "start_line": -5, "end_line": -9}, {}, "ok"),
    (
        "read-wrong-types",
        "read_file",
        {"path": "/etc/hostname", "start_line": "x", "append_loc": "yes"},
        {},
        "ok",
    ),
    ("read-path-list", "read_file", {"path": ["a"]}, {}, "400"),
    (
        "glob-star-bomb",
        "file_glob_search",
        {"path": HERE, "include": "**/" * 500 + "*a*a*a*a*a*a*b"},
        {},
        "ok",
    ),
    ("glob-limit-negative", "file_glob_search", {"path": HERE, "limit": -1}, {}, "error"),
    ("glob-limit-2^63", "file_glob_search", {"path": HERE, "limit": 2**63}, {}, "ok"),
    ("glob-depth-negative", "file_glob_search", {"path": HERE, "max_depth": -7}, {}, "ok"),
    ("glob-bad-class", "file_glob_search", {"path": HERE, "include": "[z-a"}, {}, "ok"),
    ("glob-not-a-dir", "file_glob_search", {"path": "/dev/null"}, {}, "error"),
    ("grep-invalid-regex", "grep_search", {"path": HERE, "pattern": "(?P<"}, {}, "error"),
    (
        "grep-context-huge",
        "grep_search",
        {"path": __file__, "pattern": "HOSTILE", "context_lines": 10**9},
        {},
        "ok",
    ),
    ("grep-device", "grep_search", {"path": "/dev/zero", "pattern": "x"}, {}, "error"),
    ("exec-timeout-huge", "exec_shell_command", {"command": "echo hi", "timeout": 10**12}, {}, "ok"),
    ("exec-output-negative", "exec_shell_command", {"command": "echo hi", "max_output_size": -1}, {}, "ok"),
    ("exec-nul", "exec_shell_command", {"command": "echo a\u0000b"}, {}, "ok"),
    ("exec-bad-cwd", "exec_shell_command", {"command": "pwd"}, {"x-tool-cwd": "/no/such/dir"}, "ok"),
    ("exec-command-int", "exec_shell_command", {"command": 5}, {}, "400"),
    ("write-empty-path", "write_file", {"path": "", "content": "x"}, {}, "error"),
    ("write-into-dev", "write_file", {"path": "/proc/version", "content": "x"}, {}, "error"),
    ("write-content-object", "write_file", {"path": "/tmp/x", "content": {"a": 1}}, {}, "400"),
    ("edit-edits-not-objects", "edit_file", {"path": __file__, "edits": [1, 2]}, {}, "400"),
    (
        "edit-many-bogus",
        "edit_file",
        {"path": __file__, "edits": [{"old_text": "zz\u2603", "new_text": ""}] * 5000},
        {},
        "error",
    ),
    ("model-runtime-stripped", "get_info", {"runtime": "ssh:-oProxyCommand=touch /tmp/pwned"}, {}, "ok"),
    ("runtime-header-newline", "get_info", {}, {"x-tool-runtime": "ssh:host\\nx"}, "500"),
    ("mcp-huge-argument", "echo_echo", {"message": "m" * 1_000_000}, {}, "ok"),
    ("mcp-wrong-argument-type", "t_add", {"a": "three", "b": []}, {}, "error"),
]


@pytest.mark.parametrize(
    ("name", "tool", "params", "headers", "expect"), HOSTILE, ids=[c[0] for c in HOSTILE]
)
def test_hostile_tool_params(tc, name, tool, params, headers, expect):
    start = time.monotonic()
    r = tc.post("/tools", json={"tool": tool, "params": params}, headers=headers)
    assert time.monotonic() - start < 20, name
    if expect in ("400", "500"):
        body = r.json()
        assert r.status_code == int(expect) and set(body) == {"code", "message", "type"}, (name, r.text[:300])
    else:
        assert r.status_code == 200, (name, r.text[:300])
        assert ("error" in r.json()) == (expect == "error"), (name, r.text[:300])
    assert tc.get("/health").status_code == 200
    assert not Path("/tmp/pwned").exists()


def test_symlink_out_is_listed_not_walked(tc, tmp_path):
    (tmp_path / "inside").mkdir()
    (tmp_path / "inside" / "a.txt").write_text("a")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s")
    (tmp_path / "inside" / "link").symlink_to(outside)
    (tmp_path / "inside" / "loop").symlink_to(tmp_path / "inside")
    res = call(tc, "file_glob_search", {"path": str(tmp_path / "inside"), "type": "all"})
    paths = {e["path"] for e in res["entries"]}
    assert paths == {"a.txt", "link", "loop"}
    res = call(tc, "grep_search", {"path": str(tmp_path / "inside"), "pattern": "s"})
    assert "secret" not in res["plain_text_response"]


def test_tools_dir_confines_the_builtin_tools(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("s3cr3t")
    (root / "link").symlink_to(outside)
    s = start_server(tmp_path, "-c", "256", "-np", "1", "--tools", "all", "--tools-dir", str(root))
    try:
        with s.client() as c:
            for path in (str(outside / "secret.txt"), "../elsewhere/secret.txt", "link/secret.txt"):
                res = call(c, "read_file", {"path": path})
                assert res == {"error": f"path is outside the tools directory: {path}"}
                res = call(c, "write_file", {"path": path, "content": "pwned"})
                assert res == {"error": f"path is outside the tools directory: {path}"}
            assert (outside / "secret.txt").read_text() == "s3cr3t"
            assert call(c, "write_file", {"path": "in.txt", "content": "ok"})["bytes"] == 2
            out = call(c, "exec_shell_command", {"command": "cat in.txt; pwd"})["plain_text_response"]
            assert out.startswith(f"ok{root}\n")
            res = call(c, "exec_shell_command", {"command": "touch x"}, {"x-tool-cwd": str(outside)})
            assert "error" in res and not (outside / "x").exists()
    finally:
        stop_server(s)
