"""Aggregate generation throughput and time to first token: through the HTTP server vs the engine directly.

For 1, 4 and 8 concurrent streamed requests (greedy, fixed token count, ignore_eos), measured one side after
the other in the same run: first a real `llama-server` process (uvicorn, SSE via httpx), then an `Engine`
in this process with the same slots and context. Reports tokens/s summed over all requests, the median
time to first token, and the server/engine ratio (the cost of HTTP, JSON and the thread hop).

    python packages/server/bench/bench_server.py [--n-predict 16] [--levels 1,4,8] [-m model.gguf]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from llama_engine import Engine, EngineConfig, FinalEvent, GenerationRequest, SamplingParams
from llama_server.config import bundled_model_path

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_round(base: str, n: int, n_predict: int) -> tuple[float, list[float], int]:
    ttft: list[float] = [0.0] * n
    tokens = [0] * n

    def one(i: int) -> None:
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "n_predict": n_predict, "stream": True, "ignore_eos": True,
                "temperature": 0, "cache_prompt": False}  # fmt: skip
        t0 = time.perf_counter()
        with httpx.Client(base_url=base, timeout=600) as c, c.stream("POST", "/completion", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                ev = json.loads(line[6:])
                if not ev["stop"]:
                    if tokens[i] == 0:
                        ttft[i] = time.perf_counter() - t0
                    tokens[i] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, ttft, sum(tokens)


def _engine_round(engine: Engine, n: int, n_predict: int) -> tuple[float, list[float], int]:
    tok = engine.tokenizer
    done = threading.Semaphore(0)
    ttft: list[float] = [0.0] * n
    tokens = [0] * n
    t0 = time.perf_counter()

    def on_event(i: int, ev: object) -> None:
        if isinstance(ev, FinalEvent):
            done.release()
        else:
            if tokens[i] == 0:
                ttft[i] = time.perf_counter() - t0
            tokens[i] += 1

    for i in range(n):
        prompt = tok.encode(PROMPTS[i % len(PROMPTS)], parse_special=True)
        req = GenerationRequest(prompt=prompt, max_tokens=n_predict, cache_prompt=False,
                                sampling=SamplingParams(temperature=0, ignore_eos=True))  # fmt: skip
        engine.submit(req, on_event=lambda ev, i=i: on_event(i, ev))
    for _ in range(n):
        done.acquire()
    return time.perf_counter() - t0, ttft, sum(tokens)


def _row(side: str, n: int, result: tuple[float, list[float], int]) -> tuple[float, float]:
    wall, ttft, tokens = result
    tps = tokens / wall if wall > 0 else 0.0
    med = statistics.median(ttft) * 1e3
    print(f"| {side:6} | {n:3} | {tokens:6} | {wall:8.2f} | {tps:9.2f} | {med:9.1f} |")
    return tps, med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--n-predict", type=int, default=16)
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--ctx", type=int, default=2048)
    args = ap.parse_args()
    model = args.model or str(bundled_model_path())
    levels = [int(x) for x in args.levels.split(",")]
    n_slots = max(levels)
    print(f"model: {Path(model).name}, slots: {n_slots}, n_predict: {args.n_predict}\n")
    print("| side   |   n | tokens |   wall s | tokens/s  | ttft p50 ms |")
    print("|--------|-----|--------|----------|-----------|-------------|")

    port = _free_port()
    cmd = [sys.executable, "-m", "llama_server", "-m", model, "--port", str(port), "-c", str(args.ctx),
           "-np", str(n_slots), "-kvu", "--log-disable"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    server: dict[int, tuple[float, float]] = {}
    try:
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                raise SystemExit("the server exited")
            time.sleep(0.5)
        for n in levels:  # untimed: compile the batch shapes, warm the HTTP path
            _server_round(base, n, 2)
        for n in levels:
            server[n] = _row("server", n, _server_round(base, n, args.n_predict))
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    engine = Engine(model, EngineConfig(n_ctx=args.ctx, n_parallel=n_slots, kv_unified=True)).start()
    engine.ready.wait()
    try:
        for n in levels:
            _engine_round(engine, n, 2)
        direct = {n: _row("engine", n, _engine_round(engine, n, args.n_predict)) for n in levels}
    finally:
        engine.shutdown()
    print("\nserver / engine: " + ", ".join(
        f"n={n}: {server[n][0] / direct[n][0]:.2f}x tokens/s, ttft {server[n][1] / max(direct[n][1], 1e-9):.2f}x"
        for n in levels
    ))  # fmt: skip


if __name__ == "__main__":
    main()
