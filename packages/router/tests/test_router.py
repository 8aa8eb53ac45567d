"""A real router (`llama-server --models-dir`, router mode) with real llama-server children on SmolLM2."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import Router, start_router


@pytest.fixture(scope="module")
def router(
    models_dir: Path, cache_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Router]:
    tools_dir = str(tmp_path_factory.getbasetemp())  # the tests' tmp_path directories are inside
    args = ["--models-dir", str(models_dir), "--models-max", "2", "--api-key", "sk-r,sk-o", "--tools", "read_file",
            "--tools-dir", tools_dir]  # fmt: skip
    yield from start_router(args, cache_env, "sk-r")


AUTH = {"Authorization": "Bearer sk-r"}
OTHER = {"X-Api-Key": "sk-o"}  # the router's second key: another client


def test_router_props_and_auth(router: Router) -> None:
    assert router.http.get("/health").status_code == 200
    assert router.http.get("/props").status_code == 401
    props = router.http.get("/props", headers=AUTH).json()
    assert props["role"] == "router" and props["max_instances"] == 2 and props["models_autoload"] is True
    ids = {m["id"] for m in router.http.get("/models", headers=AUTH).json()["data"]}
    assert ids == {"model-a", "model-b", "model-c"}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = router.http.post("/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["message"] == "model name is missing from the request"
    r = router.http.post("/v1/chat/completions", json={**body, "model": "nope"}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["message"] == "model 'nope' not found"
    r = router.http.post("/models/load", json={"model": "nope"}, headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = router.http.post("/models/unload", json={"model": "nope"}, headers=AUTH)
    assert r.status_code == 400


def test_stream_sse_events_and_child_key(router: Router) -> None:
    events: list[dict] = []
    ready = threading.Event()

    def listen() -> None:
        with httpx.stream("GET", router.url + "/models/sse", headers=AUTH, timeout=60) as resp:
            ready.set()
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if events[-1].get("data", {}).get("status") == "loaded":
                        return

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    assert ready.wait(10)
    body = {
        "model": "model-a",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "stream": True,
    }
    chunks = []
    with router.http.stream("POST", "/v1/chat/completions", json=body, headers=AUTH) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks)
    _streams_are_scoped_to_their_key(router, body)
    t.join(30)
    kinds = [(e["event"], e.get("data", {}).get("status")) for e in events if e["model"] == "model-a"]
    assert kinds[0] == ("model_status", "loading") and ("status_change", "loaded") in kinds
    item = next(m for m in router.http.get("/models", headers=AUTH).json()["data"] if m["id"] == "model-a")
    assert item["status"]["value"] == "loaded" and item["meta"]["n_vocab"] > 0
    port = item["status"]["args"][item["status"]["args"].index("--port") + 1]
    # the child takes only the router's own key: nothing else on the machine can use it
    assert httpx.post(f"http://127.0.0.1:{port}/tokenize", json={"content": "x"}).status_code == 401
    assert not any(k in " ".join(item["status"]["args"]) for k in ("api-key", "sk-r"))
    assert "sk-r" not in "".join(router.log)
    r = router.http.post("/models/unload", json={"model": "model-a"}, headers=AUTH)
    assert r.status_code == 200 and r.json() == {"success": True}
    router.wait_status("model-a", {"unloaded"})
    item = next(m for m in router.http.get("/models", headers=AUTH).json()["data"] if m["id"] == "model-a")
    assert "failed" not in item["status"]  # a graceful exit


def _streams_are_scoped_to_their_key(router: Router, body: dict) -> None:
    """A conversation started with one key does not exist for the other: lookup, replay and stop."""
    conv, q = "conv-scoped::model-a", {"conv_id": "conv-scoped::model-a"}
    r = router.http.post("/v1/chat/completions", json=body, headers={**AUTH, "X-Conversation-Id": conv})
    assert r.status_code == 200
    [entry] = router.http.post("/v1/streams/lookup", json={"conversation_ids": [conv]}, headers=AUTH).json()
    assert entry["conversation_id"] == conv and entry["total_bytes"] == len(r.content)
    assert (
        router.http.post("/v1/streams/lookup", json={"conversation_ids": [conv]}, headers=OTHER).json() == []
    )
    assert router.http.get("/v1/stream", params=q, headers=OTHER).status_code == 404
    assert router.http.delete("/v1/stream", params=q, headers=OTHER).status_code == 204  # nothing of theirs
    assert router.http.get("/v1/stream", params=q, headers=AUTH).content == r.content
    assert router.http.delete("/v1/stream", params=q, headers=AUTH).status_code == 204
    assert router.http.get("/v1/stream", params=q, headers=AUTH).status_code == 404


def test_no_autoload_query(router: Router) -> None:
    r = router.http.post("/tokenize?autoload=false", json={"model": "model-b", "content": "x"}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["message"] == "model is not loaded"


def test_child_killed_mid_stream(router: Router) -> None:
    router.load("model-c", headers=AUTH)
    item = next(m for m in router.http.get("/models", headers=AUTH).json()["data"] if m["id"] == "model-c")
    port = int(item["status"]["args"][item["status"]["args"].index("--port") + 1])
    pid = _pid_on_port(port)
    body = {"model": "model-c", "prompt": "Once upon a time", "n_predict": 400, "stream": True}
    lines = []
    with router.http.stream("POST", "/completion", json=body, headers=AUTH) as resp:
        for line in resp.iter_lines():
            lines.append(line)
            if len(lines) == 4:
                os.kill(pid, signal.SIGKILL)
    assert any(line.startswith("data: ") and '"error"' in line for line in lines)
    router.wait_status("model-c", {"unloaded"})
    item = next(m for m in router.http.get("/models", headers=AUTH).json()["data"] if m["id"] == "model-c")
    assert item["status"]["failed"] is True and item["status"]["exit_code"] == -9
    assert router.http.get("/health").status_code == 200  # the router lives on
    r = router.http.post("/tokenize", json={"model": "model-c", "content": "again"}, headers=AUTH)
    assert r.status_code == 200 and r.json()["tokens"]  # respawned


def _pid_on_port(port: int) -> int:
    """The pid of the process listening on a loopback port (from /proc)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        if parts[1].endswith(f":{port:04X}") and parts[3] == "0A":
            inode = parts[9]
    assert inode
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                for fd in (proc / "fd").iterdir():
                    if os.readlink(fd) == f"socket:[{inode}]":
                        return int(proc.name)
            except OSError:
                continue
    raise AssertionError("no process owns the port")


def test_models_max_evicts_lru(router: Router) -> None:
    for m in ("model-a", "model-b"):
        if router.status(m) != "loaded":
            router.load(m, headers=AUTH)
    if router.status("model-c") == "loaded":
        router.http.post("/models/unload", json={"model": "model-c"}, headers=AUTH)
        router.wait_status("model-c", {"unloaded"})
        router.load("model-a", headers=AUTH) if router.status("model-a") != "loaded" else None
    router.http.post("/tokenize", json={"model": "model-b", "content": "x"}, headers=AUTH)  # a is now LRU
    time.sleep(0.05)
    router.load("model-c", headers=AUTH)
    router.wait_status("model-a", {"unloaded"})
    assert router.status("model-b") == "loaded"


def test_tools_and_cors_from_llama_tools(router: Router, tmp_path: Path) -> None:
    """`/tools` and `/cors-proxy` served by the router itself, with llama-server's flags; tools switch
    an unset --cors-origins to `localhost`, as llama-server's policy does."""
    assert router.http.get("/tools").status_code == 401  # behind the router's key
    listed = router.http.get("/tools", headers=AUTH).json()
    assert [t["tool"] for t in listed] == ["read_file"]
    f = tmp_path / "note.txt"
    f.write_text("one\ntwo\n")
    r = router.http.post("/tools", json={"tool": "read_file", "params": {"path": str(f)}}, headers=AUTH)
    assert r.status_code == 200 and "two" in json.dumps(r.json())
    # --tools-dir confines the router's tools as llama-server's: outside (or through a link out) is refused
    (tmp_path / "out").symlink_to(Path(__file__).parent)
    for path in (__file__, str(tmp_path / "out" / "conftest.py"), "../" * 30 + "etc/hostname"):
        r = router.http.post("/tools", json={"tool": "read_file", "params": {"path": path}}, headers=AUTH)
        assert r.json() == {"error": f"path is outside the tools directory: {path}"}
    r = router.http.post("/tools", json={"tool": "write_file", "params": {}}, headers=AUTH)
    assert r.status_code == 404 and r.json()["message"] == 'unknown tool "write_file"'
    r = router.http.get("/cors-proxy", params={"url": "http://127.0.0.1:9/"}, headers=AUTH)
    assert r.status_code == 403 and r.json()["error"]["type"] == "feature_disabled"
    assert router.http.get("/props", headers=AUTH).json()["cors_proxy_enabled"] is False
    local = router.http.options("/v1/chat/completions", headers={"Origin": "http://localhost:5173"})
    assert local.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert local.headers["access-control-allow-credentials"] == "true"
    other = router.http.get("/health", headers={"Origin": "https://example.com"})
    assert "access-control-allow-origin" not in other.headers


LLAMA_CPP_SRC = Path(os.environ.get("LLAMA_CPP_SRC", Path.home() / ".cache/llama-py/llama-cpp-src-11434.0.0"))


def _processes_marked(mark: str) -> list[int]:
    """The processes whose environment holds `mark`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours
                pass
    return found


def test_sigterm_with_a_slow_mcp_call(tmp_path: Path, cache_env: dict[str, str]) -> None:
    """llama.cpp's test_mcp_slow_tool_call_slot_release: SIGTERM while a 10 s MCP call is in flight (its
    server sleeps inside the call, reading nothing): the call is answered at once, the MCP child is gone,
    and the router exits within 3 s."""
    fixture = LLAMA_CPP_SRC / "tools" / "server" / "tests" / "fixtures" / "mcp_slow_server.py"
    if not fixture.is_file():
        pytest.skip("llama.cpp's source tree is not there")
    mark = f"LLAMA_TEST_MCP_MARK={os.getpid()}-{time.monotonic_ns()}"
    key, value = mark.split("=")
    spec = {"command": sys.executable, "args": [str(fixture), "--delay", "10"], "timeout_ms": 30000,
            "env": {key: value}}  # fmt: skip
    (tmp_path / "models").mkdir()
    r = Router(["--models-dir", str(tmp_path / "models"), "--tools", "all",
                "--mcp-servers-json", json.dumps({"mcpServers": {"slow": spec}})], cache_env)  # fmt: skip
    answered: dict[str, float] = {}

    def slow() -> httpx.Response:
        res = r.http.post("/tools", json={"tool": "slow_sleep", "params": {"seconds": 10}})
        answered["at"] = time.monotonic()
        return res

    try:
        deadline = time.monotonic() + 30
        while "slow_sleep" not in r.http.get("/tools").text and time.monotonic() < deadline:  # warmed up
            time.sleep(0.05)
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(slow)
            while not _processes_marked(mark) and time.monotonic() < deadline:  # the call's child is up
                time.sleep(0.05)
            time.sleep(1)
            start = time.monotonic()
            r.proc.send_signal(signal.SIGTERM)
            r.proc.wait(timeout=15)
            elapsed = time.monotonic() - start
            res = pending.result(timeout=5)
    finally:
        r.close()
    assert res.status_code == 200 and res.json() == {"error": "cancelled"}, res.text
    assert answered["at"] - start < 1.5, "the call in flight was not ended by the shutdown"
    assert elapsed < 3, f"shutdown took {elapsed:.2f} s"
    assert not _processes_marked(mark), "the MCP child outlived the router"
    print(f"SIGTERM to exit: {elapsed:.2f} s")
