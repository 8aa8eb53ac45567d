"""Benchmark of the exact kernels (not a test): matvec GB/s of weight bytes and matmul tokens/s.

Run: ``python packages/quant/tests/bench_exact.py [--types Q4_1,Q8_0] [--n 512] [--repeat 20]``.
The machine is shared: numbers are noisy, compare within one run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from gguf import GGMLQuantizationType as T

import llama_quant
from llama_quant.kernels import ExactMatrix

SHAPES = {  # (rows, cols) seen in SmolLM2-135M / Gemma 3 270M
    T.Q4_1: [(576, 576), (1536, 576), (576, 1536)],
    T.Q8_0: [(576, 576), (8192, 576)],
    T.Q5_0: [(1024, 640)],
    T.Q4_K: [(640, 1024), (2048, 768)],
    T.Q6_K: [(640, 2048)],
    T.Q4_0: [(1536, 576)],
    T.Q5_1: [(1536, 576)],
    T.Q2_K: [(1536, 768)],
    T.Q3_K: [(1536, 768)],
    T.Q5_K: [(1536, 768)],
    T.F16: [(1536, 576)],
    T.BF16: [(1536, 576)],
    T.F32: [(1536, 576)],
}


def _raw(qt: T, w: np.ndarray) -> np.ndarray:
    if qt == T.F32:
        return w.reshape(-1).view(np.uint8)
    if qt == T.F16:
        return w.astype(np.float16).reshape(-1).view(np.uint8)
    if qt == T.BF16:
        return (w.view(np.uint32) >> 16).astype(np.uint16).reshape(-1).view(np.uint8)
    return llama_quant.quantize(w, qt)


def _best(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default=",".join(t.name for t in SHAPES))
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(
        f"{'type':6} {'shape':>11} {'raw MB':>7} {'matvec us':>10} {'GB/s':>6} {'matmul ms':>10} {'tok/s':>8}"
    )
    for name in args.types.split(","):
        qt = T[name]
        for rows, cols in SHAPES[qt]:
            raw = _raw(qt, rng.standard_normal((rows, cols)).astype(np.float32))
            m = ExactMatrix(raw, qt, rows, cols)
            x = rng.standard_normal(cols).astype(np.float32)
            xb = rng.standard_normal((args.n, cols)).astype(np.float32)
            out = np.empty(rows, np.float32)
            outb = np.empty((args.n, rows), np.float32)
            tv = _best(lambda m=m, x=x, out=out: m.matvec(x, out), args.repeat)
            tm = _best(lambda m=m, xb=xb, outb=outb: m.matmul(xb, outb), max(2, args.repeat // 10))
            print(
                f"{name:6} {rows:5}x{cols:<5} {raw.nbytes / 1e6:7.2f} {tv * 1e6:10.1f} {raw.nbytes / tv / 1e9:6.2f}"
                f" {tm * 1e3:10.1f} {args.n / tm:8.0f}"
            )


if __name__ == "__main__":
    main()
