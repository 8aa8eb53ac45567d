"""Benchmark the matrix kernels against llama.cpp's: decode matvec per type and shape, per kernel set.

    python packages/quant/bench/bench_kernels.py                 # all types, real + large shapes
    python packages/quant/bench/bench_kernels.py --types Q4_0,Q4_K --repeat 50
    python packages/quant/bench/bench_kernels.py --kernels portable,avx2

Prints best-of-N times (the machine is shared: the minimum is the least disturbed run), GMAC/s and GB/s
of weight bytes read (counted in ggml's raw size, what llama.cpp reads) of ``ExactMatrix`` under each
kernel set asked for (default: every set this host runs). Shapes marked "cold" cycle over enough copies of
the matrix (>= 96 MB) that each call reads from DRAM, not from the 32 MB L3.

The ggml columns time the same product through llama.cpp's own CPU backend (libggml-cpu.so from
llama-cpp-python, via ctypes: a mul_mat graph computed with a persistent 2-thread threadpool), one
immediately after the other; "ratio" is ggml time / our time under the best kernel set (> 1: we are
faster). Pass --no-ggml to skip.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from llama_quant.cpu import KernelSet, host_kernel_set
from llama_quant.kernels import SUPPORTED_TYPES, ExactMatrix

# byte offsets of f16 scale fields per block (random bytes there could be inf/nan)
_F16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,), T.IQ4_XS: (0,), T.TQ1_0: (52,), T.TQ2_0: (64,), T.IQ1_S: (0,), T.IQ2_XXS: (0,),
    T.IQ2_XS: (0,), T.IQ2_S: (0,), T.IQ3_XXS: (0,), T.IQ3_S: (0,),
}  # fmt: skip
# MXFP4's e8m0 exponent and IQ1_M's scale nibbles: random bytes there are valid (speed does not depend on them)
_IQ_TYPES = {T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.TQ1_0, T.TQ2_0, T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S}
_IQ_TYPES |= {T.IQ3_XXS, T.IQ3_S}
IQ_SHAPES = [(576, 1536), (640, 2048), (4096, 4096)]  # the i-quants: a few shapes, the bench stays short

REAL_SHAPES = {  # (rows, cols) the engine runs: SmolLM2-135M, then Gemma 3 270M
    "smollm2": [(576, 576), (1536, 576), (576, 1536), (49152, 576)],
    "gemma3": [(640, 640), (1024, 640), (2048, 640), (640, 2048), (262144, 640)],
}
LARGE_SHAPES = [(4096, 4096), (8192, 2048)]
COLD_BYTES = 96 << 20


def random_raw(qtype: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random raw ggml bytes with finite scales (speed does not depend on the values)."""
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    if block == 1:
        w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        if qtype == T.F32:
            return w.view(np.uint8)
        if qtype == T.F16:
            return w.astype(np.float16).view(np.uint8)
        return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    nb = rows * cols // block
    raw = rng.integers(0, 256, (nb, block_bytes), dtype=np.uint8)
    for off in _F16_FIELDS.get(qtype, ()):
        raw[:, off : off + 2] = (
            (rng.random(nb) * 0.01 + 0.001).astype(np.float16).view(np.uint8).reshape(nb, 2)
        )
    return raw.reshape(rows, -1)


def best_time(fn: Callable[[int], None], n_calls: int, repeat: int) -> float:
    """Minimum over ``repeat`` trials of the mean time of ``n_calls`` calls (fn gets the call index)."""
    fn(0)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for i in range(n_calls):
            fn(i)
        best = min(best, (time.perf_counter() - t0) / n_calls)
    return best


class GGML:
    """llama.cpp's CPU mul_mat through ctypes (libggml-base + libggml-cpu), for comparison only."""

    class _CPlan(ctypes.Structure):
        _fields_ = [
            ("work_size", ctypes.c_size_t),
            ("work_data", ctypes.c_void_p),
            ("n_threads", ctypes.c_int),
            ("threadpool", ctypes.c_void_p),
            ("abort_callback", ctypes.c_void_p),
            ("abort_callback_data", ctypes.c_void_p),
            ("use_ref", ctypes.c_bool),
        ]

    class _InitParams(ctypes.Structure):
        _fields_ = [
            ("mem_size", ctypes.c_size_t),
            ("mem_buffer", ctypes.c_void_p),
            ("no_alloc", ctypes.c_bool),
        ]

    def __init__(self, n_threads: int = 2) -> None:
        import llama_cpp

        lib = Path(llama_cpp.__file__).parent / "lib"
        self.base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        b, c, vp = self.base, self.cpu, ctypes.c_void_p
        c.ggml_cpu_init()
        b.ggml_init.restype = vp
        b.ggml_init.argtypes = [self._InitParams]
        b.ggml_new_tensor_2d.restype = vp
        b.ggml_new_tensor_2d.argtypes = [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        b.ggml_get_data.restype = vp
        b.ggml_get_data.argtypes = [vp]
        b.ggml_mul_mat.restype = vp
        b.ggml_mul_mat.argtypes = [vp, vp, vp]
        b.ggml_new_graph.restype = vp
        b.ggml_new_graph.argtypes = [vp]
        b.ggml_build_forward_expand.argtypes = [vp, vp]
        b.ggml_free.argtypes = [vp]
        b.ggml_threadpool_params_init.argtypes = [vp, ctypes.c_int]
        c.ggml_threadpool_new.restype = vp
        c.ggml_threadpool_new.argtypes = [vp]
        c.ggml_threadpool_free.argtypes = [vp]
        c.ggml_graph_plan.restype = self._CPlan
        c.ggml_graph_plan.argtypes = [vp, ctypes.c_int, vp]
        c.ggml_graph_compute.argtypes = [vp, ctypes.POINTER(self._CPlan)]
        self.n_threads = n_threads
        self._keep: tuple[Any, list[Any]] | None = None  # context and graphs of the last prepare()
        self._params = ctypes.create_string_buffer(4096)  # ggml_threadpool_params, filled by ggml
        b.ggml_threadpool_params_init(self._params, n_threads)
        self.pool = c.ggml_threadpool_new(self._params)

    def close(self) -> None:
        self.cpu.ggml_threadpool_free(self.pool)

    def prepare(
        self, raws: list[np.ndarray], qtype: T, rows: int, cols: int, n: int
    ) -> Callable[[int], None]:
        """A function computing X @ W_i.T for the i-th (mod len) copy of the weights with ggml."""
        b = self.base
        wbytes = raws[0].nbytes
        mem = len(raws) * (wbytes + 4 * (rows + cols) * n + 4096) + (64 << 20)
        ctx = b.ggml_init(self._InitParams(mem, None, False))
        graphs = []
        x = np.random.default_rng(0).standard_normal((n, cols)).astype(np.float32)
        for raw in raws:
            a = b.ggml_new_tensor_2d(ctx, int(qtype), cols, rows)
            ctypes.memmove(b.ggml_get_data(a), raw.ctypes.data, wbytes)
            xt = b.ggml_new_tensor_2d(ctx, int(T.F32), cols, n)
            ctypes.memmove(b.ggml_get_data(xt), x.ctypes.data, x.nbytes)
            gf = b.ggml_new_graph(ctx)
            b.ggml_build_forward_expand(gf, b.ggml_mul_mat(ctx, a, xt))
            plan = self.cpu.ggml_graph_plan(gf, self.n_threads, self.pool)
            work = np.empty(max(plan.work_size, 1), np.uint8)
            plan.work_data = work.ctypes.data
            graphs.append((gf, plan, work))
        self._keep = (ctx, graphs)

        def run(i: int) -> None:
            gf, plan, _ = graphs[i % len(graphs)]
            self.cpu.ggml_graph_compute(gf, ctypes.byref(plan))

        return run

    def release(self) -> None:
        assert self._keep is not None
        ctx, _ = self._keep
        self.base.ggml_free(ctx)
        self._keep = None


def raw_nbytes(qtype: T, rows: int, cols: int) -> int:
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    return rows * cols // block * block_bytes


def _matvec_nth(mats: list[ExactMatrix], x: np.ndarray, out: np.ndarray, i: int) -> None:
    mats[i % len(mats)].matvec(x, out)


def bench_matvec(types: list[T], kernel_sets: list[KernelSet], repeat: int, ggml: GGML | None) -> None:
    rng = np.random.default_rng(0)
    hdr = f"{'type':5} {'shape':>12} {'mem':4}"
    for k in kernel_sets:
        hdr += f" {k.name.lower() + ' us':>11} {'GMAC/s':>7} {'GB/s':>6}"
    if ggml:
        hdr += f" {'ggml us':>8} {'ggml GB/s':>9} {'ratio':>6}"
    print(hdr)
    for qtype in types:
        shapes = [(s, "warm") for m in REAL_SHAPES.values() for s in m]
        shapes += [(s, "warm") for s in LARGE_SHAPES] + [(s, "cold") for s in LARGE_SHAPES]
        if qtype in _IQ_TYPES:
            shapes = [(s, "warm") for s in IQ_SHAPES]
        for (rows, cols), mem in shapes:
            if cols % GGML_QUANT_SIZES[qtype][0]:
                continue
            nbytes = raw_nbytes(qtype, rows, cols)
            copies = max(1, -(-COLD_BYTES // nbytes)) if mem == "cold" else 1
            raws = [random_raw(qtype, rows, cols, rng) for _ in range(copies)]
            x = rng.standard_normal(cols).astype(np.float32)
            out = np.empty(rows, np.float32)
            calls = max(3, min(200, int(3e7 / nbytes)))
            line = f"{qtype.name:5} {rows:>6}x{cols:<5} {mem:4}"
            best = float("inf")
            for k in kernel_sets:
                mats = [ExactMatrix(r, qtype, rows, cols, k) for r in raws]
                t = best_time(functools.partial(_matvec_nth, mats, x, out), calls, repeat)
                best = min(best, t)
                line += f" {t * 1e6:11.1f} {rows * cols / t / 1e9:7.2f} {nbytes / t / 1e9:6.2f}"
                del mats
            if ggml:
                run = ggml.prepare(raws, qtype, rows, cols, 1)
                tg = best_time(run, calls, repeat)
                ggml.release()
                line += f" {tg * 1e6:8.1f} {nbytes / tg / 1e9:9.2f} {tg / best:6.2f}"
            print(line, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--types",
        default=",".join(t.name for t in sorted(SUPPORTED_TYPES)),
        help="comma-separated ggml type names",
    )
    host = [k for k in KernelSet if k <= host_kernel_set()]
    p.add_argument(
        "--kernels",
        default=",".join(k.name.lower() for k in host),
        help="comma-separated kernel sets (portable, avx2, avx512)",
    )
    p.add_argument("--repeat", type=int, default=20, help="trials per measurement (best is kept)")
    p.add_argument("--no-ggml", action="store_true", help="skip the llama.cpp comparison")
    args = p.parse_args()
    types = [T[name] for name in args.types.split(",")]
    kernel_sets = [KernelSet[name.strip().upper()] for name in args.kernels.split(",")]
    ggml = None if args.no_ggml else GGML(2)
    try:
        bench_matvec(types, kernel_sets, args.repeat, ggml)
    finally:
        if ggml:
            ggml.close()


if __name__ == "__main__":
    main()
