"""Scheduling between requests: short requests beside a long prompt, high priority under a full queue, and
the cost of the latency histograms.

1. Time to first token (client side, streamed /completion) of short requests sent one after another while
   another slot evaluates a ~4,096-token prompt, against the same requests on an idle server: ours and
   llama.cpp's llama-server (when built), each with `-np 2`.
2. Under `--scheduling-policy priority` with every slot generating and a queue of waiting requests: TTFT of
   short requests sent with a higher priority, against the same requests at the queue's priority.
3. What observing the histograms costs per generated token (`llama_server.latency`, in-process).

    python packages/server/bench/bench_scheduling.py [--long-tokens 4096] [--samples 20]
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import httpx
from _servers import (
    LLAMA_CPP_HINT,
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

from llama_server.latency import LatencyHistograms

SHORT = {"prompt": "Tell me a short joke about cats.", "n_predict": 2, "cache_prompt": False}


def _long_prompt(client: httpx.Client, n_tokens: int) -> list[int]:
    """About n_tokens of plain text, as token ids (both servers take ids: the same prompt for each)."""
    words = " ".join(f"lighthouse{i % 97} keeper{i % 89}" for i in range(n_tokens))
    ids: list[int] = client.post("/tokenize", json={"content": words}).json()["tokens"]
    return ids[:n_tokens]


def _ttfts(client: httpx.Client, n: int, body: dict) -> list[float]:
    return [stream_completion(client, body).ttft for _ in range(n)]


def _beside_long_prompt(
    base: str, long_ids: list[int], samples: int
) -> tuple[list[float], list[float], float]:
    """(idle TTFTs, TTFTs while a long prompt is evaluated, seconds the long prompt took)."""
    with httpx.Client(base_url=base, timeout=900) as c:
        _ttfts(c, 3, SHORT)  # warm
        idle = _ttfts(c, samples, SHORT)
        busy: list[float] = []
        took: list[float] = []

        def run_long() -> None:
            with httpx.Client(base_url=base, timeout=900) as c2:
                t = time.monotonic()
                c2.post("/completion", json={"prompt": long_ids, "n_predict": 1, "cache_prompt": False})
                took.append(time.monotonic() - t)

        while len(busy) < samples:
            th = threading.Thread(target=run_long)
            th.start()
            time.sleep(0.2)  # the long prompt is under way
            while th.is_alive() and len(busy) < samples:
                busy.append(stream_completion(c, SHORT).ttft)
                time.sleep(0.05)
            th.join()
        return idle, busy, sum(took) / len(took)


def _row(name: str, idle: list[float], busy: list[float], long_s: float) -> None:
    i50, b50, b95 = (percentile(v, q) * 1e3 for v, q in ((idle, 50), (busy, 50), (busy, 95)))
    print(f"| {name} | {i50:.0f} | {b50:.0f} | {b95:.0f} | {b50 / i50:.1f}x | {long_s:.1f} |")


def _priority(model: str, samples: int) -> None:
    """Every slot generating, a queue waiting: TTFT of short requests at a higher priority and at the
    queue's."""
    port = free_port()
    cmd = ours_command(model, port, "-np", "2", "-c", "4096", "--scheduling-policy", "priority", "--metrics")
    with serve(cmd) as srv:
        srv.wait_health()
        stop = threading.Event()
        background = {"prompt": "Write a long story about the sea.", "n_predict": 200, "ignore_eos": True}
        background |= {"priority": 5}

        def load() -> None:
            with httpx.Client(base_url=srv.base, timeout=900) as c:
                while not stop.is_set():
                    stream_completion(c, background, stop)

        workers = [threading.Thread(target=load) for _ in range(6)]  # 2 running, 4 waiting
        for w in workers:
            w.start()
        time.sleep(2.0)
        with httpx.Client(base_url=srv.base, timeout=900) as c:
            high = _ttfts(c, samples, SHORT | {"priority": 0})
            same = _ttfts(c, max(samples // 4, 2), SHORT | {"priority": 5})
            lines = c.get("/metrics").text.splitlines()
            n_pre = next(ln.split()[1] for ln in lines if ln.startswith("llamacpp:n_preemptions_total "))
        stop.set()
        for w in workers:
            w.join()
    print("\n#### High priority under a full queue (ours, -np 2, 2 generating + 4 waiting at priority 5)\n")
    print("| request | TTFT p50 (ms) | TTFT p95 (ms) |")
    print("|---|---|---|")
    print(f"| priority 0 (preempts) | {percentile(high, 50) * 1e3:.0f} | {percentile(high, 95) * 1e3:.0f} |")
    print(f"| priority 5 (queues) | {percentile(same, 50) * 1e3:.0f} | {percentile(same, 95) * 1e3:.0f} |")
    print(f"\n{n_pre} preemptions; the preempted requests resumed where they stopped.")


def _histogram_cost() -> None:
    h = LatencyHistograms("bench", 4096)
    n = 200_000
    t = time.perf_counter()
    for _ in range(n):
        h.inter_token(0.01)
    per = (time.perf_counter() - t) / n * 1e6
    print(f"\nHistogram overhead: {per:.2f} us per generated token (two histograms observed).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--long-tokens", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=20)
    args = ap.parse_args()
    model = args.model or smollm2()
    print(f"### Scheduling ({Path(model).name}; host: {cpu_features()})\n")
    print(f"#### Short requests beside a {args.long_tokens}-token prompt (-np 2), client-side TTFT\n")
    print("| server | idle p50 (ms) | busy p50 (ms) | busy p95 (ms) | busy/idle | long prompt (s) |")
    print("|---|---|---|---|---|---|")
    ctx = ("-np", "2", "-c", str(2 * (args.long_tokens + 256)))
    port = free_port()
    with serve(ours_command(model, port, *ctx)) as srv:
        srv.wait_health()
        with httpx.Client(base_url=srv.base, timeout=60) as c:
            long_ids = _long_prompt(c, args.long_tokens)
        _row("ours", *_beside_long_prompt(srv.base, long_ids, args.samples))
    binary = llama_cpp_tool("llama-server")
    if binary is None:
        print(f"\n(llama.cpp's llama-server not found: {LLAMA_CPP_HINT})")
    else:
        port = free_port()
        with serve(llama_cpp_command(binary, model, port, *ctx)) as srv:
            srv.wait_health()
            _row("llama.cpp", *_beside_long_prompt(srv.base, long_ids, args.samples))
    _priority(model, args.samples)
    _histogram_cost()


if __name__ == "__main__":
    main()
