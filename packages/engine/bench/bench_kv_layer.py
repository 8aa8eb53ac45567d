"""One attention layer per KV cache type pair: the typed kernel (``ops.flash_attn``) on its own.

SmolLM2's shape (9 query heads, 3 KV heads, head size 64), one token over ``--cells`` cells (default 1024),
random cache rows; best of ``--repeats`` calls (default 200). Run it with ``NUMBA_NUM_THREADS=1`` for the
time of one job after another (the kernel runs one job per KV head in parallel). Arguments after the
options filter the rows (``q8_0``: the rows with that type as K or V). The machine's load average is
printed: the numbers only mean something on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from llama_engine.kv_types import encode_rows, kv_type
from llama_engine.ops import attention_typed

HEAD_DIM, N_HEAD, N_HEAD_KV = 64, 9, 3
ROWS = [
    ("q8_0", "f16", False),
    ("q8_0", "q8_0", True),
    ("q4_0", "q4_0", True),
    ("q4_1", "q4_1", True),
    ("q5_0", "q5_0", True),
    ("q5_1", "q5_1", True),
    ("iq4_nl", "iq4_nl", True),
    ("bf16", "bf16", True),
    ("f16", "f16", True),
    ("f32", "f32", True),
]


def measure(name_k: str, name_v: str, flash: bool, n_cells: int, repeats: int) -> float:
    """The best time of one call, in seconds."""
    rng = np.random.default_rng(3)
    tk, tv = kv_type(name_k), kv_type(name_v)
    kc = encode_rows(tk, rng.standard_normal((n_cells, N_HEAD_KV * HEAD_DIM)).astype(np.float32))
    vc = encode_rows(tv, rng.standard_normal((n_cells, N_HEAD_KV * HEAD_DIM)).astype(np.float32))
    q = rng.standard_normal((1, N_HEAD * HEAD_DIM)).astype(np.float32)
    cells = np.arange(n_cells, dtype=np.int32)
    lo, hi = np.zeros(1, np.int32), np.full(1, n_cells, np.int32)
    out = np.zeros_like(q)
    args = (out, q, kc, vc, cells, lo, hi, 1, N_HEAD, N_HEAD_KV, HEAD_DIM, 0.125, tk.code, tv.code, flash)
    attention_typed(*args)  # compiles (or loads) the kernel
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        attention_typed(*args)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("types", nargs="*")
    a = ap.parse_args()
    print(f"threads: {os.environ.get('NUMBA_NUM_THREADS', 'all')}, cells: {a.cells}, best of {a.repeats}")
    print(f"{'K / V':18} {'fa':4} {'time':>9} {'load':>5}")
    for k, v, flash in ROWS:
        if a.types and k not in a.types and v not in a.types:
            continue
        best = measure(k, v, flash, a.cells, a.repeats)
        print(
            f"{k + ' / ' + v:18} {'on' if flash else 'off':4} {best * 1e6:7.0f} µs {os.getloadavg()[0]:5.1f}"
        )


if __name__ == "__main__":
    main()
