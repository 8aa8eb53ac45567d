"""Fast float kernels (f32 sums in vector lanes) against the exact ones (f64 sums, the portable build's bits)
on SmolLM2 converted to F16: what a batch of tokens costs per weight matrix, decode tokens/s, and how far the
fast path's next-token distributions are from the exact path's (llama-perplexity's KL divergence figures
over the same text, the exact run as the base).

    python packages/engine/bench/bench_fast_floats.py [--chunks 4] [-c 512]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).parent))
from bench_speculative import PROMPTS, measure, smollm2_f16
from quant_table import EVAL_MODULES, docstring_text

from llama_quant.cpu import host_kernel_set
from llama_quant.kernels import ExactMatrix

TOKENS = (1, 2, 4, 9, 16)


def _per_call_us(m: ExactMatrix, x: np.ndarray) -> float:
    m.matmul(x)  # compiled and warm
    best = float("inf")
    for _ in range(5):
        t, k = time.perf_counter(), 0
        while time.perf_counter() - t < 0.1:
            m.matmul(x)
            k += 1
        best = min(best, (time.perf_counter() - t) / k * 1e6)
    return best


def matrix_table(rows: int = 1536, cols: int = 576) -> None:
    """SmolLM2's FFN up-projection shape: microseconds per call by token count, both modes."""
    rng = np.random.default_rng(0)
    raw = rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8).reshape(rows, -1)
    fast = ExactMatrix(raw, T.F16, rows, cols, exact=False)
    exact = ExactMatrix(raw, T.F16, rows, cols, exact=True)
    print(f"\nF16 {rows} x {cols} matrix (kernel set {host_kernel_set().name.lower()}): us per call")
    print(f"{'tokens':>6} {'exact':>8} {'fast':>8} {'speed-up':>9} {'fast vs 1 token':>16}")
    one = 0.0
    for n in TOKENS:
        x = rng.standard_normal((n, cols)).astype(np.float32)
        e, f = _per_call_us(exact, x), _per_call_us(fast, x)
        one = one or f
        print(f"{n:6} {e:8.0f} {f:8.0f} {e / f:8.2f}x {f / one:15.2f}x")


def decode_table() -> None:
    print("\nDecode, one greedy stream of 128 tokens (tok/s, best of 2)")
    rates = {exact: measure(None, PROMPTS["story"], exact)[0] for exact in (True, False)}
    print(f"exact {rates[True]:.1f}  fast {rates[False]:.1f}  ({rates[False] / rates[True]:.2f}x)")


def kl_table(chunks: int, ctx: int) -> None:
    """llama-perplexity over the same text: the exact path saves its logits, the fast path is compared."""
    exe = str(Path(sys.executable).with_name("llama-perplexity"))
    with tempfile.TemporaryDirectory() as tmp:
        text, base = Path(tmp) / "text.txt", Path(tmp) / "exact.kld"
        text.write_text(docstring_text(EVAL_MODULES))
        args = [exe, "-m", str(smollm2_f16()), "-f", str(text), "-c", str(ctx), "--chunks", str(chunks)]
        env = dict(os.environ)
        subprocess.run(
            [*args, "--kl-divergence-base", str(base)],
            env={**env, "LLAMA_EXACT_FLOATS": "1"},
            check=True,
            capture_output=True,
        )
        r = subprocess.run(
            [*args, "--kl-divergence-base", str(base), "--kl-divergence"],
            env={**env, "LLAMA_EXACT_FLOATS": "0"},
            check=True,
            capture_output=True,
            text=True,
        )
    print(
        f"\nKL divergence of the fast path from the exact one ({chunks} chunks of {ctx} tokens, F16 SmolLM2)"
    )
    for line in (r.stdout + r.stderr).splitlines():
        if re.match(
            r"\s*(Mean PPL|Mean\s+KLD|Maximum KLD|99\.9%\s+KLD|Median\s+KLD|Same top p|RMS Δp)", line
        ):
            print("  " + line.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    a, _ = ap.parse_known_args()  # nox -s bench passes its posargs to every script
    matrix_table()
    decode_table()
    kl_table(a.chunks, a.ctx_size)


if __name__ == "__main__":
    main()
