"""Our llama-server against llama.cpp's own `llama-server`: aggregate generated tokens/s and time to first token
(p50, p95) for 1, 4 and 8 concurrent streams on SmolLM2 with 8 slots; and against the engine driven directly
in this process (what the HTTP path costs).

Both servers get the same flags: 8 slots of the same context (`-c` is the whole KV buffer, split evenly:
`-no-kvu`), the same threads, streamed `/completion` requests with the same prompts, greedy, a fixed token
count (`ignore_eos`), `cache_prompt` off. Everything is measured at the client: tokens/s is every token event
of every stream over the wall time of the level, time to first token is the first token event of a request.
The two servers take turns (ours, llama.cpp, ours, ...) for ``--rounds`` rounds, one process at a time,
nothing else running; each level keeps the best tokens/s of ``--repeats`` runs per turn and the best turn,
and the time-to-first-token percentiles are taken over every request of every turn.

    python packages/server/bench/bench_server.py [--n-predict 64] [--repeats 3] [--rounds 2] [--levels 1,4,8]

llama.cpp's `llama-server` comes from $LLAMA_CPP_BIN or the `llama-cpp` nox session's cache (without it only
our server and the engine are measured).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from _servers import (
    LLAMA_CPP_HINT,
    THREADS,
    Stream,
    cpu_features,
    free_port,
    llama_cpp_command,
    llama_cpp_tool,
    ours_command,
    percentile,
    serve,
    smollm2,
    stream_completion,
)

from llama_engine import Engine, EngineConfig, FinalEvent, GenerationRequest, SamplingParams

PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at",
    "My favourite recipe for bread is",
    "In the year 1969,",
    "A list of prime numbers: 2, 3, 5,",
]


@dataclass
class Level:
    """One side's figures at one stream count: the best tokens/s seen, every time to first token."""

    tps: float = 0.0
    ttft: list[float] = field(default_factory=list)

    def add(self, wall: float, tokens: int, ttft: list[float]) -> None:
        self.tps = max(self.tps, tokens / wall if wall > 0 else 0.0)
        self.ttft += ttft


def _body(i: int, n_predict: int) -> dict:
    return {
        "prompt": PROMPTS[i % len(PROMPTS)],
        "n_predict": n_predict,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
    }


def _http_round(clients: list[httpx.Client], n: int, n_predict: int) -> tuple[float, int, list[float]]:
    """n concurrent streams, each on its own keep-alive client: wall time, tokens, times to first token."""
    streams: list[Stream | None] = [None] * n

    def one(i: int) -> None:
        s = stream_completion(clients[i], _body(i, n_predict))
        if s.status == 0 and not s.token_times and "RemoteProtocolError" in s.error:
            # the request went out on a kept-alive connection the server closed as it sat idle (llama.cpp's
            # HTTP library closes them after 5 s): no response at all, so it is sent again on a new one
            s = stream_completion(clients[i], _body(i, n_predict))
        streams[i] = s

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    done = [s for s in streams if s is not None]
    if any(s.status != 200 or len(s.token_times) != n_predict for s in done):
        seen = [(len(s.token_times), s.status, s.ending, s.error) for s in done]
        raise SystemExit(f"a stream did not get {n_predict} tokens (tokens, status, ending, error): {seen}")
    return wall, sum(len(s.token_times) for s in done), [s.ttft for s in done]


def _measure_server(
    side: str, cmd: list[str], levels: list[int], args: argparse.Namespace, out: dict[int, Level]
) -> None:
    print(f"... {side}: starting", file=sys.stderr)
    with serve(cmd) as server:
        print(f"... ready in {server.wait_health():.1f} s; measuring", file=sys.stderr)
        # one keep-alive client per stream, made before any timing: an httpx.Client loads the TLS
        # certificates (about 50 ms of CPU), a client-side cost that says nothing about the server
        clients = [httpx.Client(base_url=server.base, timeout=600) for _ in range(max(levels))]
        try:
            for n in levels:  # untimed: compile the batch shapes, warm the HTTP path, open the connections
                _http_round(clients, n, 4)
            for n in levels:
                for _ in range(args.repeats):
                    out[n].add(*_http_round(clients, n, args.n_predict))
        finally:
            for c in clients:
                c.close()


def _engine_round(engine: Engine, n: int, n_predict: int) -> tuple[float, int, list[float]]:
    tok = engine.tokenizer
    done = threading.Semaphore(0)
    ttft = [0.0] * n
    tokens = [0] * n
    t0 = time.monotonic()

    def on_event(i: int, ev: object) -> None:
        if isinstance(ev, FinalEvent):
            done.release()
            return
        if tokens[i] == 0:
            ttft[i] = time.monotonic() - t0
        tokens[i] += 1

    for i in range(n):
        prompt = tok.encode(PROMPTS[i % len(PROMPTS)], parse_special=True)
        req = GenerationRequest(
            prompt=prompt,
            max_tokens=n_predict,
            cache_prompt=False,
            sampling=SamplingParams(temperature=0, ignore_eos=True),
        )
        engine.submit(req, on_event=lambda ev, i=i: on_event(i, ev))
    for _ in range(n):
        done.acquire()
    return time.monotonic() - t0, sum(tokens), ttft


def _measure_engine(model: str, levels: list[int], args: argparse.Namespace) -> dict[int, Level]:
    out = {n: Level() for n in levels}
    n_slots = max(levels)
    config = EngineConfig(n_ctx=args.ctx * n_slots, n_parallel=n_slots, kv_unified=False, n_threads=THREADS)
    engine = Engine(model, config).start()
    engine.ready.wait()
    try:
        for n in levels:
            _engine_round(engine, n, 4)
        for n in levels:
            for _ in range(args.repeats):
                out[n].add(*_engine_round(engine, n, args.n_predict))
    finally:
        engine.shutdown()
    return out


def _ttft(level: Level) -> str:
    """p50 / p95 of the level's times to first token, in ms."""
    return f"{percentile(level.ttft, 50) * 1e3:.0f} / {percentile(level.ttft, 95) * 1e3:.0f}"


def _print_table(levels: list[int], ours: dict, theirs: dict | None, engine: dict) -> None:
    cols = [
        "streams",
        "ours tok/s",
        "llama.cpp tok/s",
        "ratio",
        "ours TTFT p50/p95 ms",
        "llama.cpp TTFT p50/p95 ms",
        "engine tok/s",
        "server/engine",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("-" * (len(c) + 1) + ":" for c in cols) + "|")
    for n in levels:
        a, e = ours[n], engine[n]
        b = theirs[n] if theirs else None
        row = [
            str(n),
            f"{a.tps:.1f}",
            f"{b.tps:.1f}" if b else "-",
            f"{a.tps / b.tps:.2f}x" if b else "-",
            _ttft(a),
            _ttft(b) if b else "-",
            f"{e.tps:.1f}",
            f"{a.tps / e.tps:.2f}x",
        ]
        print("| " + " | ".join(v.rjust(len(c)) for v, c in zip(row, cols, strict=True)) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--ctx", type=int, default=2048, help="context of each slot")
    args = ap.parse_args()
    model = args.model or smollm2()
    levels = [int(x) for x in args.levels.split(",")]
    n_slots = max(levels)
    flags = ["-c", str(args.ctx * n_slots), "-np", str(n_slots), "-no-kvu"]
    binary = llama_cpp_tool("llama-server")
    print(
        f"\n## llama-server (ours) vs llama.cpp's llama-server, {Path(model).name}, {n_slots} slots of "
        f"{args.ctx} tokens, {THREADS} threads, {args.n_predict} tokens per stream, best of {args.repeats} x "
        f"{args.rounds} rounds; CPU: {cpu_features()}\n"
    )
    if binary is None:
        print(f"(llama.cpp's llama-server is not built: {LLAMA_CPP_HINT})\n")
    ours = {n: Level() for n in levels}
    theirs = {n: Level() for n in levels} if binary else None
    for _ in range(args.rounds):
        _measure_server("ours", ours_command(model, free_port(), *flags), levels, args, ours)
        if binary and theirs is not None:
            _measure_server(
                "llama.cpp", llama_cpp_command(binary, model, free_port(), *flags), levels, args, theirs
            )
    print("... the engine, in this process", file=sys.stderr)
    engine = _measure_engine(model, levels, args)  # last: its numba threads stay in this process
    _print_table(levels, ours, theirs, engine)


if __name__ == "__main__":
    main()
