"""llama-router's cost: aggregate generated tokens/s and time to first token (p50, p95) through the router
against the same child `llama-server` reached directly, on SmolLM2, for 1 and 4 concurrent streams.

One router (`--models-dir` with SmolLM2) starts one child; the child's own address and private key are read
from the router's model list and the child's environment, so both paths hit the very same process. Streamed
`/completion` requests, greedy, a fixed token count (`ignore_eos`), `cache_prompt` off; router and direct
take turns run by run for ``--rounds`` rounds (the side that goes first alternating); tokens/s is the median
of each side's runs, the TTFT percentiles are over every request. Target: within 3% of the direct tokens/s
and 5 ms of its TTFT. Wall times depend on what else the machine runs, so the table also gives the load
average and CPU time per generated token (from /proc/<pid>/schedstat, summed over threads) of the router
and of the child, which depend far less on it: the router's is its whole cost, and the child's shows
whether the relay makes the engine work harder (its OpenMP threads spin while one of them is preempted).

    python packages/router/bench/bench_router.py [--n-predict 64] [--repeats 3] [--rounds 2] [--levels 1,4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "server" / "bench"))
from _servers import THREADS, Stream, cpu_features, free_port, percentile, serve, smollm2, stream_completion

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "Water boils at"]
MODEL = "smol"


@dataclass
class Level:
    tps: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    cpu: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))  # (router, child) s/token

    def add(self, wall: float, tokens: int, ttft: list[float], cpu: tuple[float, float]) -> None:
        self.tps.append(tokens / wall if wall > 0 else 0.0)
        self.ttft += ttft
        for out, seconds in zip(self.cpu, cpu, strict=True):
            out.append(seconds / tokens)


def _cpu(pid: int) -> float:
    """CPU seconds the process `pid` has run, all its threads (schedstat: nanoseconds, not clock ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def _round(clients: list[httpx.Client], n: int, n_predict: int) -> tuple[float, int, list[float]]:
    streams: list[Stream | None] = [None] * n

    def one(i: int) -> None:
        body = {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "n_predict": n_predict,
                "temperature": 0, "ignore_eos": True, "cache_prompt": False}  # fmt: skip
        streams[i] = stream_completion(clients[i], body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    done = [s for s in streams if s is not None]
    if any(s.status != 200 or len(s.token_times) != n_predict for s in done):
        raise SystemExit(
            f"a stream did not get {n_predict} tokens: {[(s.status, len(s.token_times)) for s in done]}"
        )
    return wall, sum(len(s.token_times) for s in done), [s.ttft for s in done]


def _child(router: str) -> tuple[str, int, str]:
    """Load the model through the router; the child's base URL, its pid and its private key."""
    with httpx.Client(base_url=router, timeout=600) as c:
        c.post("/models/load", json={"model": MODEL}).raise_for_status()
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            item = next(m for m in c.get("/models").json()["data"] if m["id"] == MODEL)
            if item["status"]["value"] == "loaded":
                break
            time.sleep(0.2)
        else:
            raise SystemExit("the child did not load")
    args = item["status"]["args"]
    port = int(args[args.index("--port") + 1])
    return f"http://127.0.0.1:{port}", *_child_key(port)


def _child_key(port: int) -> tuple[int, str]:
    """The pid and key (from its environment) of the process listening on `port` (a bench on this machine
    only)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--port" in cmd and cmd[cmd.index(b"--port") + 1] == str(port).encode():
            for kv in env:
                if kv.startswith(b"LLAMA_API_KEY="):
                    return int(proc.name), kv.split(b"=", 1)[1].decode()
    raise SystemExit("the child's key was not found")


def _measure(
    sides: list[tuple[list[httpx.Client], dict[int, Level]]],
    levels: list[int],
    args: argparse.Namespace,
    pids: tuple[int, int],
) -> None:
    """Router and direct runs interleaved one by one, so a change in the machine's load hits both."""
    for clients, _ in sides:
        for n in levels:  # untimed: open the connections, warm the path
            _round(clients, n, 4)
    for n in levels:
        for _ in range(args.repeats):
            for clients, out in sides:
                before = [_cpu(p) for p in pids]
                wall, tokens, ttft = _round(clients, n, args.n_predict)
                used = [_cpu(p) - b for p, b in zip(pids, before, strict=True)]
                out[n].add(wall, tokens, ttft, (used[0], used[1]))


def _hop(via: httpx.Client, direct: httpx.Client, n: int = 200) -> tuple[float, float]:
    """p50 round trip (ms) of a tiny `/tokenize`, interleaved: what the extra hop costs without the model."""
    times: tuple[list[float], list[float]] = ([], [])
    body = {"model": MODEL, "content": "hi"}
    for _ in range(n):
        for client, out in ((via, times[0]), (direct, times[1])):
            t0 = time.monotonic()
            client.post("/tokenize", json=body).raise_for_status()
            out.append(time.monotonic() - t0)
    return percentile(times[0], 50) * 1e3, percentile(times[1], 50) * 1e3


def _ms(level: Level, q: float) -> float:
    return percentile(level.ttft, q) * 1e3


def _us(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e6:.0f}"


def _print_table(levels: list[int], via: dict[int, Level], direct: dict[int, Level]) -> None:
    cols = ["streams", "router tok/s", "direct tok/s", "ratio", "router TTFT p50/p95 ms", "direct TTFT p50/p95 ms",
            "TTFT p50 delta ms", "router CPU us/token", "child CPU us/token via / direct"]  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("-" * (len(c) + 1) + ":" for c in cols) + "|")
    for n in levels:
        a, b = via[n], direct[n]
        tps_a, tps_b = statistics.median(a.tps), statistics.median(b.tps)
        row = [str(n), f"{tps_a:.1f}", f"{tps_b:.1f}", f"{tps_a / tps_b:.3f}x",
               f"{_ms(a, 50):.1f} / {_ms(a, 95):.1f}", f"{_ms(b, 50):.1f} / {_ms(b, 95):.1f}",
               f"{_ms(a, 50) - _ms(b, 50):+.1f}", _us(a.cpu[0]),
               f"{_us(a.cpu[1])} / {_us(b.cpu[1])}"]  # fmt: skip
        print("| " + " | ".join(v.rjust(len(c)) for v, c in zip(row, cols, strict=True)) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--levels", default="1,4")
    ap.add_argument("--ctx", type=int, default=2048, help="context of each slot")
    args, _ = ap.parse_known_args()  # the bench session passes every script the same arguments
    model = args.model or smollm2()
    levels = [int(x) for x in args.levels.split(",")]
    slots = max(levels)
    router_bin = Path(sys.executable).parent / "llama-router"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / f"{MODEL}.gguf").symlink_to(model)
        port = free_port()
        flags = ["-c", str(args.ctx * slots), "-np", str(slots), "-no-kvu", "-t", str(THREADS)]
        cmd = [str(router_bin), "--models-dir", d, "--port", str(port), "--log-disable", *flags]
        print(
            f"\n## llama-router vs its child directly, {Path(model).name}, {slots} slots of {args.ctx} tokens, "
            f"{THREADS} threads, {args.n_predict} tokens per stream, median of {args.repeats} x {args.rounds} "
            f"rounds; CPU: {cpu_features()}\n"
        )
        with serve(cmd) as server:
            server.wait_health()
            child, child_pid, key = _child(server.base)
            load = [os.getloadavg()[0]]
            print("... measuring", file=sys.stderr)
            via = [httpx.Client(base_url=server.base, timeout=600) for _ in range(slots)]
            auth = {"Authorization": f"Bearer {key}"}
            direct = [httpx.Client(base_url=child, timeout=600, headers=auth) for _ in range(slots)]
            out_via = {n: Level() for n in levels}
            out_direct = {n: Level() for n in levels}
            try:
                hop = _hop(via[0], direct[0])
                for i in range(args.rounds):  # the side that goes first alternates
                    sides = [(via, out_via), (direct, out_direct)]
                    _measure(sides if i % 2 == 0 else sides[::-1], levels, args, (server.proc.pid, child_pid))
                    load.append(os.getloadavg()[0])
            finally:
                for c in via + direct:
                    c.close()
    _print_table(levels, out_via, out_direct)
    print(f"\n/tokenize round trip p50: {hop[0]:.2f} ms through the router, {hop[1]:.2f} ms direct")
    print(f"load average (1 min) at the start and after each round: {' '.join(f'{x:.2f}' for x in load)}")


if __name__ == "__main__":
    main()
