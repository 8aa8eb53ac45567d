"""Aggregate generation throughput and time to first token: through the HTTP server vs the engine directly,
and vs llama-cpp-python's OpenAI-compatible server (`llama_cpp.server`).

For 1, 4 and 8 concurrent streamed requests (greedy, fixed token count, ignore_eos), measured one side after
the other in the same run: first a real `llama-server` process (uvicorn, SSE via httpx), then an `Engine`
in this process with the same slots and context, then `python -m llama_cpp.server` on the same model and
threads (streamed /v1/completions; it serves one request at a time). Reports tokens/s summed over all
requests, the median time to first token, and the ratios; each level is the best of `--repeats` rounds.

    python packages/server/bench/bench_server.py [--n-predict 32] [--repeats 3] [--levels 1,4,8] [-m model.gguf]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

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


def _clients(base: str, n: int) -> list[httpx.Client]:
    """One keep-alive client per concurrent stream, made before any timing: creating an httpx.Client loads
    the TLS certificates (about 50 ms of CPU), a client-side cost that says nothing about the server."""
    return [httpx.Client(base_url=base, timeout=600) for _ in range(n)]


def _stream_round(
    clients: list[httpx.Client], n: int, path: str, body: dict, is_token: Callable[[dict], bool]
) -> tuple[float, list[float], int]:
    """n concurrent streamed POSTs of ``body`` (prompt filled in), each on its own client: wall time, time to
    first token of each, and the SSE events ``is_token`` counts as tokens."""
    ttft: list[float] = [0.0] * n
    tokens = [0] * n

    def one(i: int) -> None:
        t0 = time.perf_counter()
        request = {**body, "prompt": PROMPTS[i % len(PROMPTS)]}
        with clients[i].stream("POST", path, json=request) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                if is_token(json.loads(line[6:])):
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


def _server_round(clients: list[httpx.Client], n: int, n_predict: int) -> tuple[float, list[float], int]:
    body = {
        "n_predict": n_predict,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
        "cache_prompt": False,
    }
    return _stream_round(clients, n, "/completion", body, lambda ev: not ev["stop"])


def _openai_round(clients: list[httpx.Client], n: int, n_predict: int) -> tuple[float, list[float], int]:
    body = {"max_tokens": n_predict, "stream": True, "temperature": 0}
    return _stream_round(clients, n, "/v1/completions", body, lambda ev: bool(ev["choices"][0].get("text")))


def _wait_ready(base: str, proc: subprocess.Popen, path: str) -> None:
    while True:
        try:
            if httpx.get(base + path, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[2]} exited")
        time.sleep(0.5)


def _llama_cpp_python(
    model: str, levels: list[int], args: argparse.Namespace
) -> dict[int, tuple[float, float]]:
    try:
        import llama_cpp.server.app  # noqa: F401
    except ImportError:
        print("| (llama_cpp.server is not installed: pip install 'llama-cpp-python[server]') |")
        return {}
    port = _free_port()
    threads = str(os.cpu_count() or 2)
    # --interrupt_requests False: concurrent requests wait their turn instead of cancelling the running one
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--port", str(port), "--host", "127.0.0.1",
           "--n_ctx", str(args.ctx), "--n_threads", threads, "--n_threads_batch", threads,
           "--interrupt_requests", "False"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, proc, "/v1/models")
        clients = _clients(base, max(levels))
        for n in levels:
            _openai_round(clients, n, 2)
        return {
            n: _row("l-c-p", n, _best(args.repeats, _openai_round, clients, n, args.n_predict))
            for n in levels
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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


Round: TypeAlias = tuple[float, list[float], int]


def _best(repeats: int, one_round: Callable[..., Round], *args: object) -> Round:
    """The round with the highest tokens/s of ``repeats`` (this machine's neighbours make single runs noisy)."""
    return max(
        (one_round(*args) for _ in range(max(repeats, 1))), key=lambda r: r[2] / r[0] if r[0] > 0 else 0.0
    )


def _row(side: str, n: int, result: tuple[float, list[float], int]) -> tuple[float, float]:
    wall, ttft, tokens = result
    tps = tokens / wall if wall > 0 else 0.0
    med = statistics.median(ttft) * 1e3
    print(f"| {side:6} | {n:3} | {tokens:6} | {wall:8.2f} | {tps:9.2f} | {med:9.1f} |")
    return tps, med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
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
        _wait_ready(base, proc, "/health")
        clients = _clients(base, n_slots)
        for n in levels:  # untimed: compile the batch shapes, warm the HTTP path and open the connections
            _server_round(clients, n, 2)
        for n in levels:
            server[n] = _row("server", n, _best(args.repeats, _server_round, clients, n, args.n_predict))
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    engine = Engine(model, EngineConfig(n_ctx=args.ctx, n_parallel=n_slots, kv_unified=True)).start()
    engine.ready.wait()
    try:
        for n in levels:
            _engine_round(engine, n, 2)
        direct = {
            n: _row("engine", n, _best(args.repeats, _engine_round, engine, n, args.n_predict))
            for n in levels
        }
    finally:
        engine.shutdown()
    theirs = _llama_cpp_python(model, levels, args)
    print("\nserver / engine: " + ", ".join(
        f"n={n}: {server[n][0] / direct[n][0]:.2f}x tokens/s, ttft {server[n][1] / max(direct[n][1], 1e-9):.2f}x"
        for n in levels
    ))  # fmt: skip
    if theirs:
        print("server / llama_cpp.server: " + ", ".join(
            f"n={n}: {server[n][0] / theirs[n][0]:.2f}x tokens/s, ttft {server[n][1] / max(theirs[n][1], 1e-9):.2f}x"
            for n in levels
        ))  # fmt: skip


if __name__ == "__main__":
    main()
