"""Start-up time: process start to `/health` 200 and to the first completion, for our llama-server on a fresh
machine (an empty numba cache), on its second start (the cache that first start wrote), and for llama.cpp's
own `llama-server` beside them.

The numba cache is a fresh temporary folder named by NUMBA_CACHE_DIR (set explicitly, so the figure does not
depend on where the product keeps its cache by default); it is removed at the end. The warm start and
llama.cpp's are the best of ``--repeats``.

    python packages/server/bench/bench_start.py [--repeats 2] [-m model.gguf]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
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
    serve,
    smollm2,
)

FIRST = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "cache_prompt": False}
FLAGS = ["-c", "2048", "-np", "4"]


def _start(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Seconds from process start to /health 200, and to the end of a first 8-token completion."""
    with serve(cmd, env) as server:
        health = server.wait_health()
        with httpx.Client(base_url=server.base, timeout=900) as client:
            r = client.post("/completion", json=FIRST)
            first = time.monotonic() - server.started
        if r.status_code != 200:
            raise SystemExit(f"{cmd[0]}: first completion answered {r.status_code}: {r.text[:200]}")
    return health, first


def _best(repeats: int, cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    runs = [_start(cmd, env) for _ in range(max(repeats, 1))]
    return min(h for h, _ in runs), min(f for _, f in runs)


def _row(side: str, times: tuple[float, float]) -> None:
    print(f"| {side:<40} | {times[0]:9.2f} | {times[1]:16.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    model = args.model or smollm2()
    print(
        f"\n## start-up, {Path(model).name}, {' '.join(FLAGS)}, seconds from process start; "
        f"CPU: {cpu_features()}\n"
    )
    print(f"| {'server':<40} | {'/health':>9} | {'first completion':>16} |")
    print(f"|{'-' * 42}|{'-' * 11}|{'-' * 18}|")
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        env = {"NUMBA_CACHE_DIR": cache}
        print(f"... our first start compiles its kernels into {cache}", file=sys.stderr)
        _row("llama-server (ours), empty numba cache", _start(ours_command(model, free_port(), *FLAGS), env))
        n_files = sum(1 for p in Path(cache).rglob("*") if p.is_file())
        _row(
            "llama-server (ours), second start",
            _best(args.repeats, ours_command(model, free_port(), *FLAGS), env),
        )
    binary = llama_cpp_tool("llama-server")
    if binary:
        _row(
            "llama.cpp's llama-server",
            _best(args.repeats, llama_cpp_command(binary, model, free_port(), *FLAGS)),
        )
    else:
        print(f"\n(llama.cpp's llama-server is not built: {LLAMA_CPP_HINT})")
    print(f"\n(the first start wrote {n_files} files to its numba cache)")


if __name__ == "__main__":
    main()
