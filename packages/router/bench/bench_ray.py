"""llama-router on a Ray cluster of two nodes on this machine: aggregate tokens/s of 8 streams over 2 replicas
(one per node, half the cores each) against 1 replica (every core), the router's added latency per request against the replica reached
directly, and the time from a node's death to a replacement replica serving.

On one 2-core machine two replicas share the same cores, so the first figure shows the overhead of the
cluster path, not a speed-up. The nodes are `ray start` processes on loopback (Ray's node-death detection
set to 500 ms x 3, as `--ray local` does).

    python packages/router/bench/bench_ray.py [--n-predict 64] [--rounds 2] [--latency-requests 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "server" / "bench"))
from _servers import cpu_features, smollm2

from llama_router.cluster import LocalCluster, _session_members

ROUTER = str(Path(sys.executable).parent / "llama-router")
SERVER = str(Path(sys.executable).parent / "llama-server")
PROMPT = "Once upon a time"


def _start_router(preset: Path, address: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [ROUTER, "--port", "0", "--models-preset", str(preset), "--ray", address, "--ray-namespace", "bench"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "LLAMA_SERVER_BIN": SERVER},
    )  # fmt: skip
    assert proc.stderr is not None
    while line := proc.stderr.readline():
        if "listening on http://" in line:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            return proc, line.strip().split("listening on ")[1]
    raise RuntimeError("the router did not start")


def _cluster(http: httpx.Client, model: str) -> dict[str, Any]:
    item = next(i for i in http.get("/models").json()["data"] if i["id"] == model)
    return dict(item["status"]["cluster"])


def _wait_serving(http: httpx.Client, model: str, n: int, timeout: float = 180) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = _cluster(http, model)
        if sum(m["state"] == "loaded" for m in st["replicas"]) == n:
            return st
        time.sleep(0.05)
    raise RuntimeError(f"{model}: {n} replicas never served")


def _aggregate(base: str, model: str, streams: int, n_predict: int) -> float:
    """Tokens/s of `streams` concurrent greedy completions of `n_predict` tokens each."""
    body = {"model": model, "prompt": PROMPT, "n_predict": n_predict, "ignore_eos": True, "temperature": 0,
            "cache_prompt": False}  # fmt: skip
    tokens: list[int] = []

    def one() -> None:
        r = httpx.post(base + "/completion", json=body, timeout=300)
        r.raise_for_status()
        tokens.append(int(r.json()["tokens_predicted"]))

    threads = [threading.Thread(target=one) for _ in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens) / (time.perf_counter() - t0)


def _latency(http: httpx.Client, url: str, headers: dict[str, str], model: str, n: int) -> list[float]:
    body = {"model": model, "prompt": PROMPT, "n_predict": 1, "temperature": 0}
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        http.post(url + "/completion", json=body, headers=headers).raise_for_status()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _replica_key(address: str, name: str) -> str:
    """The private key the router gave a replica (read from its actor, as the router does)."""
    code = (
        f"import ray, json; ray.init(address={address!r}, namespace='bench', logging_level='ERROR');"
        f"a = ray.get_actor({name!r}); print(json.dumps(ray.get(a.info.remote())))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return str(json.loads(out.strip().splitlines()[-1])["key"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--latency-requests", type=int, default=30)
    args = ap.parse_args()
    model = smollm2()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    cores = os.cpu_count() or 2  # 1 replica: every core; 2 replicas: half each (threads and Ray's CPUs)
    (tmp / "p.ini").write_text(
        f"[*]\nmodel = {model}\nctx-size = 2048\nparallel = 4\nno-warmup = true\n\n"
        f"[one]\nreplicas = 1\nnum-cpus = {cores}\nthreads = {cores}\n\n"
        f"[two]\nreplicas = 2\nnum-cpus = {max(cores // 2, 1)}\nthreads = {max(cores // 2, 1)}\n"
    )
    print(
        f"# llama-router on Ray: 2 local nodes, SmolLM2 Q4_1; host {cpu_features()}, {os.cpu_count()} cores"
    )
    local = LocalCluster(2, cpus=2 * cores)  # room on one node for all three after the other dies
    t0 = time.time()
    address = local.start()
    router, base = _start_router(tmp / "p.ini", address)
    http = httpx.Client(base_url=base, timeout=300)
    try:
        _wait_serving(http, "one", 1)
        two = _wait_serving(http, "two", 2)
        print(f"cluster and 3 replicas up in {time.time() - t0:.1f} s; 'two' on nodes "
              f"{sorted({m['node_id'][:8] for m in two['replicas']})}")  # fmt: skip
        rows: dict[str, list[float]] = {"one": [], "two": []}
        _aggregate(base, "one", 2, 8)
        _aggregate(base, "two", 2, 8)
        for _ in range(args.rounds):
            for name in ("one", "two"):
                rows[name].append(_aggregate(base, name, args.streams, args.n_predict))
        print("\n| replicas | nodes | streams | tokens/s (runs) | median |\n|--:|--:|--:|--|--:|")
        for name, n in (("one", 1), ("two", 2)):
            runs = ", ".join(f"{x:.1f}" for x in rows[name])
            print(f"| {n} | {n} | {args.streams} | {runs} | {statistics.median(rows[name]):.1f} |")
        print(f"ratio 2 replicas / 1: {statistics.median(rows['two']) / statistics.median(rows['one']):.2f}x")
        # the router's added latency: the same replica through the router and directly (1-token requests)
        st = _cluster(http, "one")
        url = st["replicas"][0]["url"]
        key = _replica_key(address, "one/0")
        direct_h = {"Authorization": f"Bearer {key}"}
        via, direct = [], []
        with httpx.Client(timeout=60) as c:
            for _ in range(2):
                via += _latency(c, base, {}, "one", args.latency_requests // 2)
                direct += _latency(c, url, direct_h, "one", args.latency_requests // 2)
        p50v, p50d = statistics.median(via), statistics.median(direct)
        print("\n| path | requests | p50 ms | p95 ms |\n|--|--:|--:|--:|")
        for name, xs in (("via router", via), ("direct", direct)):
            xs = sorted(xs)
            print(
                f"| {name} | {len(xs)} | {statistics.median(xs):.2f} | {xs[int(0.95 * (len(xs) - 1))]:.2f} |"
            )
        print(f"router's added latency per request (p50): {p50v - p50d:+.2f} ms")
        # a node dies: time until its replica of 'two' serves again on the live node
        worker = local.procs[1].pid
        lost_pids = set(_session_members({worker}))
        lost = [m for m in two["replicas"] if m["pid"] in lost_pids]
        t_kill = time.time()
        for pid in lost_pids:
            os.kill(pid, 9)
        out_at = back_at = 0.0
        deadline = time.time() + 120
        while time.time() < deadline:
            st = _cluster(http, "two")
            serving = [m for m in st["replicas"] if m["state"] == "loaded"]
            if not out_at and len(serving) < 2:
                out_at = time.time()
            if out_at and len(serving) == 2:
                back_at = time.time()
                break
            time.sleep(0.05)
        r = http.post("/completion", json={"model": "two", "prompt": PROMPT, "n_predict": 4})
        print(f"\nnode death (replicas on it: {len(lost)}): out of the balance after {out_at - t_kill:.2f} s, "
              f"a replacement serving after {back_at - t_kill:.2f} s; next request {r.status_code}")  # fmt: skip
    finally:
        http.close()
        router.terminate()
        router.wait(60)
        local.stop()


if __name__ == "__main__":
    main()
