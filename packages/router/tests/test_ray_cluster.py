"""llama-router on a real Ray cluster: two `ray start` nodes on loopback (each its own process session, so a
test can kill one whole node: raylet, workers and their llama-server children), replicas of the real
SmolLM2 placed on both, balanced, autoscaled from zero and back, replaced when a node dies, and adopted by a
restarted router. Plus the preset settings, the autoscaler's decisions and `--ray local`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SERVER, SMOL, Router

from llama_router.catalogue import CatalogueError, build_catalogue
from llama_router.cluster import (
    FAST_HEALTH,
    ClusterSpec,
    ScaleState,
    _session_members,
    conversation_key,
    decide,
    parse_size,
)
from llama_router.ray_replica import free_port

ROUTER = str(Path(sys.executable).parent / "llama-router")
RAY = str(Path(sys.executable).parent / "ray")
CHAT = {"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_tokens": 8}
ENV = {"LLAMA_SERVER_BIN": SERVER}
KEY = "router-key-1"


# -- settings and decisions (no cluster) -----------------------------------------------------------------


def _preset(tmp_path: Path, body: str) -> str:
    p = tmp_path / "preset.ini"
    p.write_text(f"[m]\nmodel = {SMOL}\n{body}")
    return str(p)


def test_preset_replica_settings(tmp_path: Path) -> None:
    e = build_catalogue(None, _preset(tmp_path, "replicas = 3\nnum-cpus = 2\nmemory = 1G\n"), {})["m"]
    assert e.cluster == ClusterSpec(min_replicas=3, max_replicas=3, num_cpus=2.0, memory=1 << 30)
    assert "replicas" not in e.options and "num-cpus" not in e.options  # not passed to llama-server
    e = build_catalogue(
        None, _preset(tmp_path, "min-replicas = 0\nmax-replicas = 4\ntarget-ongoing-requests = 1\n"), {}
    )["m"]
    assert (e.cluster.min_replicas, e.cluster.max_replicas, e.cluster.target) == (0, 4, 1.0)  # type: ignore[union-attr]
    assert build_catalogue(None, _preset(tmp_path, ""), {})["m"].cluster is None
    for body, message in [
        ("min-replicas = 3\nmax-replicas = 2\n", "min-replicas 3 is more than max-replicas 2"),
        ("replicas = 2\nmax-replicas = 2\n", "not both"),
        ("replicas = two\n", "is not a number"),
        ("replicas = 0\n", "must be >= 1"),
        ("replicas = 2\nmemory = lots\n", "not a size"),
        ("replicas = 2\nremote = http://127.0.0.1:1\n", "give one"),
    ]:
        with pytest.raises(CatalogueError, match=message):
            build_catalogue(None, _preset(tmp_path, body), {})
    assert parse_size("512M") == 512 << 20 and parse_size("2GiB") == 2 << 30 and parse_size("100") == 100


def test_replicas_without_ray_is_a_clear_error(tmp_path: Path) -> None:
    r = subprocess.run(
        [ROUTER, "--port", "0", "--models-preset", _preset(tmp_path, "replicas = 2\n")],
        capture_output=True, text=True, timeout=60, env={**os.environ, **ENV},
    )  # fmt: skip
    assert r.returncode != 0
    assert "asks for replicas on a Ray cluster: start the router with --ray" in r.stderr


def test_a_bad_ray_address_is_a_clear_error(tmp_path: Path) -> None:
    preset = _preset(tmp_path, "replicas = 1\n")
    for address, message in [
        (f"127.0.0.1:{free_port('127.0.0.1')}", "cannot reach the Ray cluster at 127.0.0.1:"),
        ("nonsense", "expected auto, local or HOST:PORT"),
    ]:
        t0 = time.time()
        r = subprocess.run(
            [ROUTER, "--port", "0", "--models-preset", preset, "--ray", address],
            capture_output=True, text=True, timeout=60, env={**os.environ, **ENV},
        )  # fmt: skip
        assert r.returncode != 0 and message in r.stderr, r.stderr[-2000:]
        assert time.time() - t0 < 30


def test_autoscaler_decisions() -> None:
    spec = ClusterSpec(min_replicas=0, max_replicas=3, target=2, upscale_delay=10, sleep_idle=30)
    st = ScaleState()
    assert decide(spec, 0, 0, 0.0, st) == (0, "")
    n, why = decide(spec, 0, 1, 1.0, st)  # from zero: at once
    assert n == 1 and "waiting" in why
    assert decide(spec, 1, 5, 2.0, st) == (1, "")  # above the target: not yet
    assert decide(spec, 1, 5, 11.0, st)[1] == ""  # still less than upscale-delay
    n, why = decide(spec, 1, 5, 12.0, st)
    assert n == 3 and "target 2" in why
    assert decide(spec, 3, 9, 100.0, st)[0] == 3  # max
    assert decide(spec, 3, 1, 101.0, st) == (3, "")  # busy: no scale down
    assert decide(spec, 3, 0, 102.0, st) == (3, "")  # idle starts
    n, why = decide(spec, 3, 0, 132.5, st)
    assert n == 0 and "idle" in why
    st = ScaleState()
    assert decide(spec, 1, 3, 0.0, st) == (1, "")  # a dip resets the clock
    assert decide(spec, 1, 2, 5.0, st) == (1, "")
    assert decide(spec, 1, 3, 12.0, st) == (1, "")
    keep = ClusterSpec(min_replicas=2, max_replicas=2)
    assert decide(keep, 2, 0, 1e6, ScaleState()) == (2, "")  # never below min, never idle-stopped by default


def test_conversation_key() -> None:
    a = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    b = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                 {"role": "user", "content": "more"}]}).encode()  # fmt: skip
    assert conversation_key("", a) != conversation_key("", b)  # the first two messages
    c = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                    "temperature": 1}).encode()  # fmt: skip
    assert conversation_key("", b) == conversation_key("", c)
    assert conversation_key("x", a) == "c:x"
    assert conversation_key("", b"not json") == ""
    assert conversation_key("", json.dumps({"prompt": "abc" * 1000}).encode()).startswith("p:")


# -- a real two-node cluster ---------------------------------------------------------------------------------


class Node:
    """One `ray start --block` process and its session (raylet, workers, their children)."""

    def __init__(self, args: list[str], temp: str) -> None:
        common = ["--block", "--disable-usage-stats", "--num-cpus=2", "--object-store-memory=100000000",
                  f"--dashboard-agent-listen-port={free_port('127.0.0.1')}",
                  f"--metrics-export-port={free_port('127.0.0.1')}"]  # fmt: skip
        self.log = Path(temp) / f"node-{len(os.listdir(temp))}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [RAY, "start", *common, *args], stdout=out, stderr=out, start_new_session=True,
                env={**os.environ, **FAST_HEALTH},
            )  # fmt: skip

    def wait(self, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if "Ray runtime started" in self.log.read_text(errors="replace"):
                return
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        raise AssertionError("ray node did not start:\n" + self.log.read_text(errors="replace")[-3000:])

    def pids(self) -> list[int]:
        return _session_members({self.proc.pid})

    def kill(self) -> None:
        """The node dies at once: every process of its session SIGKILLed."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
    temp = tempfile.mkdtemp(prefix="ray-test-")
    port = free_port("127.0.0.1")
    head = Node(["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}/r"], temp)
    head.wait()
    worker = Node([f"--address=127.0.0.1:{port}"], temp)
    worker.wait()
    try:
        yield {"address": f"127.0.0.1:{port}", "head": head, "worker": worker}
    finally:
        for node in (worker, head):
            node.kill()
        shutil.rmtree(temp, ignore_errors=True)


PRESET = f"""
[*]
ctx-size = 512
parallel = 2
no-warmup = true

[smol]
model = {SMOL}
replicas = 2
num-cpus = 1

[elastic]
model = {SMOL}
min-replicas = 0
max-replicas = 2
num-cpus = 0.5
target-ongoing-requests = 1
upscale-delay = 1
sleep-idle-seconds = 4
"""


def _router(cluster: dict[str, Any], tmp: Path, *extra: str) -> Router:
    (tmp / "preset.ini").write_text(PRESET)
    (tmp / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 60)  # a model file no server can load
    preset = PRESET + f"\n[broken]\nmodel = {tmp / 'broken.gguf'}\nmin-replicas = 0\nmax-replicas = 1\n"
    (tmp / "preset.ini").write_text(preset)
    args = ["--models-preset", str(tmp / "preset.ini"), "--ray", cluster["address"], "--ray-namespace", "t",
            "--api-key", KEY, *extra]  # fmt: skip
    r = Router(args, ENV, key=KEY, program=ROUTER)
    r.http.headers.update(r.auth)  # every request of these tests carries the router's key
    return r


def _cluster_status(r: Router, model: str) -> dict[str, Any]:
    for item in r.http.get("/models").json()["data"]:
        if item["id"] == model:
            return dict(item["status"]["cluster"])
    raise AssertionError(model)


def _wait(r: Router, model: str, check: Any, timeout: float = 90, what: str = "") -> dict[str, Any]:
    deadline = time.time() + timeout
    st: dict[str, Any] = {}
    while time.time() < deadline:
        st = _cluster_status(r, model)
        if check(st):
            return st
        time.sleep(0.2)
    raise AssertionError(f"{model}: {what} not reached: {json.dumps(st)}\n" + "".join(r.log[-40:]))


def _serving(st: dict[str, Any], n: int) -> bool:
    return sum(1 for m in st["replicas"] if m["state"] == "loaded") == n


@pytest.fixture(scope="module")
def router(cluster: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    r = _router(cluster, tmp_path_factory.mktemp("router"))
    try:
        yield r
    finally:
        r.close()


def _chat(r: Router, model: str, **kw: Any) -> httpx.Response:
    return r.http.post("/v1/chat/completions", json={**CHAT, "model": model, **kw})


def test_replicas_spread_over_both_nodes_and_balance(router: Router) -> None:
    st = _wait(router, "smol", lambda s: _serving(s, 2), what="two replicas serving")
    assert len({m["node_id"] for m in st["replicas"]}) == 2, (
        st
    )  # one per node: the node with the fewest of its replicas
    assert router.status("smol") == "loaded"
    results: list[int] = []

    def one() -> None:
        results.append(_chat(router, "smol").status_code)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 8
    served = [m["served"] for m in _cluster_status(router, "smol")["replicas"]]
    assert min(served) >= 2, served  # both replicas took their share
    # one conversation, one request at a time: every turn goes back to the replica holding its prefix
    before = {m["name"]: m["served"] for m in _cluster_status(router, "smol")["replicas"]}
    convo = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]}
    for _ in range(4):
        assert _chat(router, "smol", **convo).status_code == 200
        time.sleep(0.2)  # the next turn comes after the router has counted this one as finished
    after = {m["name"]: m["served"] for m in _cluster_status(router, "smol")["replicas"]}
    assert sorted(after[n] - before[n] for n in after) == [0, 4], (before, after)


def test_the_routers_key_guards_every_replica(router: Router) -> None:
    body = {**CHAT, "model": "smol"}
    assert httpx.post(router.url + "/v1/chat/completions", json=body, timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert (
        httpx.post(router.url + "/v1/chat/completions", json=body, headers=wrong, timeout=30).status_code
        == 401
    )
    assert httpx.get(router.url + "/health", timeout=30).status_code == 200
    st = _cluster_status(router, "smol")
    for m in st["replicas"]:  # a replica reached directly refuses a request without its own private key
        assert httpx.post(m["url"] + "/v1/chat/completions", json=body, timeout=30).status_code == 401
        assert httpx.post(m["url"] + "/v1/chat/completions", json=body, headers=router.auth,
                          timeout=30).status_code == 401  # fmt: skip
    assert '"key"' not in router.http.get("/models").text


def test_a_model_that_does_not_load_fails_its_requests(router: Router) -> None:
    t0 = time.time()
    r = _chat(router, "broken")
    assert r.status_code == 500 and "model name=broken failed to load" in r.text, r.text
    assert time.time() - t0 < 60
    assert any("replica broken/0: its llama-server exited" in line for line in router.log)
    # no retry loop: back to none until the next request (which tries again, and fails again)
    _wait(router, "broken", lambda s: s["desired"] == 0 and not s["replicas"], timeout=30, what="none")
    assert router.status("broken") == "unloaded"
    assert _chat(router, "broken").status_code == 500


def test_resumable_stream_on_a_replica(router: Router) -> None:
    """A conversation's stream, left by its client, is found and replayed on the replica that runs it."""
    conv = "ray-conv-1"
    body = {**CHAT, "model": "smol", "stream": True, "max_tokens": 24}
    with router.http.stream(
        "POST", "/v1/chat/completions", json=body, headers={"X-Conversation-Id": conv}
    ) as r:
        assert r.status_code == 200
        for _ in r.iter_lines():
            break  # the client goes away: the replica keeps generating
    found = router.http.post("/v1/streams/lookup", json={"conversation_ids": [conv, "other"]}).json()
    assert [e["conversation_id"] for e in found] == [conv]
    replay = router.http.get("/v1/stream", params={"conv_id": conv, "from": 0})
    assert replay.status_code == 200
    assert replay.text.rstrip().endswith("data: [DONE]")
    assert router.http.delete("/v1/stream", params={"conv_id": conv}).status_code == 204


def test_scale_from_zero_up_and_back_to_zero(router: Router) -> None:
    st = _cluster_status(router, "elastic")
    assert st["desired"] == 0 and st["replicas"] == [] and router.status("elastic") == "unloaded"
    first = _chat(router, "elastic")  # the request waits while a replica starts
    assert first.status_code == 200, first.text + "".join(router.log[-30:])
    assert any("elastic: 0 -> 1 replica(s)" in line for line in router.log)
    # four requests in flight, target 1 per replica: a second replica after upscale-delay
    results: list[int] = []

    def long() -> None:
        results.append(_chat(router, "elastic", max_tokens=150).status_code)

    threads = [threading.Thread(target=long) for _ in range(4)]
    for t in threads:
        t.start()
    _wait(router, "elastic", lambda s: s["desired"] == 2, timeout=30, what="scale up to 2")
    for t in threads:
        t.join()
    assert results == [200] * 4
    assert any(
        "elastic: 1 -> 2 replica(s): " in line and "target 1 per replica" in line for line in router.log
    )
    # idle past sleep-idle-seconds: back to min (0)
    _wait(router, "elastic", lambda s: s["desired"] == 0 and not s["replicas"], timeout=30, what="scale to 0")
    assert router.wait_status("elastic", {"unloaded"}, timeout=10) == "unloaded"
    assert any("-> 0 replica(s): idle for" in line for line in router.log)


def _stream(r: Router, out: dict[str, Any]) -> None:
    """A long streamed chat: what it received, and when it ended."""
    body = {**CHAT, "model": "smol", "max_tokens": 400, "stream": True, "ignore_eos": True}
    events: list[str] = []
    try:
        with r.http.stream("POST", "/v1/chat/completions", json=body, timeout=60) as resp:
            out["status"] = resp.status_code
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
    except httpx.HTTPError as e:
        out["exc"] = repr(e)
    out["events"] = events
    out["ended"] = time.time()


def test_a_node_dies_mid_load(router: Router, cluster: dict[str, Any]) -> None:
    _wait(router, "smol", lambda s: _serving(s, 2), what="two replicas serving")
    worker_node = next(m["node_id"] for m in _cluster_status(router, "smol")["replicas"]
                       if m["pid"] in cluster["worker"].pids())  # fmt: skip
    streams = [dict[str, Any]() for _ in range(4)]
    threads = [threading.Thread(target=_stream, args=(router, s)) for s in streams]
    for t in threads:
        t.start()
    deadline = time.time() + 30  # both replicas are streaming
    while time.time() < deadline and not all(s.get("status") for s in streams):
        time.sleep(0.05)
    time.sleep(1.0)
    killed_at = time.time()
    cluster["worker"].kill()
    # requests that had not started: none is lost
    later = [_chat(router, "smol") for _ in range(4)]
    assert [x.status_code for x in later] == [200] * 4, [x.text for x in later]
    assert router.http.get("/health").status_code == 200
    for t in threads:
        t.join(60)
    cut = [s for s in streams if s["events"] and s["events"][-1] != "[DONE]"]
    done = [s for s in streams if s["events"] and s["events"][-1] == "[DONE]"]
    assert len(cut) == 2 and len(done) == 2, [s["events"][-2:] for s in streams]
    for s in cut:  # the streams on the dead node ended with an error event, within seconds
        err = json.loads(s["events"][-1])
        assert err["error"]["type"] == "server_error", s["events"][-1]
        assert s["ended"] - killed_at < 10
    # the lost replica is rescheduled on the live node
    st = _wait(router, "smol", lambda s: _serving(s, 2) and worker_node not in {m["node_id"] for m in s["replicas"]},
               timeout=90, what="replacement on the live node")  # fmt: skip
    assert len({m["node_id"] for m in st["replicas"]}) == 1
    assert sum(m["restarts"] for m in st["replicas"]) == 1
    assert [_chat(router, "smol").status_code for _ in range(2)] == [200, 200]


def test_a_restarted_router_adopts_the_live_replicas(
    router: Router, cluster: dict[str, Any], tmp_path: Path
) -> None:
    st = _wait(router, "smol", lambda s: _serving(s, 2), what="two replicas serving")
    pids = sorted(m["pid"] for m in st["replicas"])
    router.proc.send_signal(signal.SIGKILL)  # a crash: the detached replicas live on
    router.proc.wait(10)
    again = _router(cluster, tmp_path)
    try:
        st = _wait(again, "smol", lambda s: _serving(s, 2), timeout=30, what="adopted replicas")
        assert sorted(m["pid"] for m in st["replicas"]) == pids  # the same servers, not new ones
        assert any("found replica smol/0 still running" in line for line in again.log)
        assert _chat(again, "smol").status_code == 200
    finally:
        again.close()  # an orderly exit stops them
    assert not [p for p in pids if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_ray_local_builds_a_cluster_on_this_machine(tmp_path: Path) -> None:
    (tmp_path / "p.ini").write_text(
        f"[one]\nmodel = {SMOL}\nreplicas = 1\nctx-size = 256\nno-warmup = true\n"
    )
    r = Router(["--models-preset", str(tmp_path / "p.ini"), "--ray", "local", "--ray-nodes", "2",
                "--ray-namespace", "local-test"], ENV, program=ROUTER)  # fmt: skip
    try:
        assert any("ray: 2 node(s) alive" in line for line in r.log)
        _wait(r, "one", lambda s: _serving(s, 1), what="one replica")
        assert _chat(r, "one").status_code == 200
        node_pids = [int(x) for x in _pgrep("raylet.*llama-router-ray-")]
        assert len(node_pids) >= 2
    finally:
        r.close()
    assert not [p for p in node_pids if _alive(p)]  # the router stops the nodes it started


def _pgrep(name: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", name], capture_output=True, text=True).stdout
    return out.split()
