"""QuantMatrix: one weight matrix in a ggml type, repacked once, multiplied by f32 activations.

Build one ``QuantMatrix`` per weight and call ``matvec`` (one token) or ``matmul`` (a batch) on it. Small
batches run the integer kernels (activations quantized once per batch to Q8_0 or Q8_K, as llama.cpp does);
large batches dequantize a slab of weight rows to f32 and hand it to numpy's BLAS, which is compute-bound
and several times faster per token there. These kernels use fastmath and are close to ggml's results, not
equal to them; the engine uses ``llama_quant.kernels.exact.ExactMatrix``, whose products are bit for bit
llama.cpp's.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from gguf import GGMLQuantizationType as T

from . import deq, floats, kq, q32
from ._common import TILE_ROWS, n_tiles, quantize_q8

if TYPE_CHECKING:
    import gguf_io

__all__ = ["SUPPORTED_TYPES", "Activations", "QuantMatrix"]

# Batches of more tokens than this take the dequantize + BLAS path (measured with bench/bench_kernels.py).
BLAS_MIN_TOKENS = 16
_SLAB_BYTES = 16 << 20  # f32 weight slab per BLAS step: a whole layer matrix of these models in one sgemm


@dataclass(frozen=True, slots=True)
class _Spec:
    block: int  # values per block (1 for floats)
    block_bytes: int
    act: str  # activation format: "q8_0", "q8_k" or "f32"
    pack: Callable[[np.ndarray, int, int], tuple[np.ndarray, ...]]
    mv: Callable[..., None] | None  # (arrays, out, xq, xd, xs, n, rows, nb)
    deq: Callable[..., None] | None  # (arrays, wt, g0, n_tiles, nb)


def _q32(name: str, bb: int, mv: Callable[..., None], dq: Callable[..., None]) -> _Spec:
    return _Spec(32, bb, "q8_0", lambda raw, r, c: q32.pack(name, raw, r, c), mv, dq)


def _kq(name: str, bb: int, mv: Callable[..., None], dq: Callable[..., None]) -> _Spec:
    return _Spec(256, bb, "q8_k", lambda raw, r, c: kq.pack(name, raw, r, c), mv, dq)


def _as_words(raw: np.ndarray, rows: int, cols: int, dtype: type) -> tuple[np.ndarray, ...]:
    return (np.ascontiguousarray(raw).view(dtype).reshape(rows, cols),)


# fmt: off
_SPECS: dict[T, _Spec] = {
    T.Q4_0: _q32("Q4_0", 18,
        lambda a, o, xq, xd, xs, n, r, nb: q32.mv_q4(o, a[0], a[1], a[1], xq, xd, xs, n, r, nb, False),
        lambda a, wt, g0, n, nb: deq.deq_q4(wt, a[0], a[1], a[1], g0, n, nb, False)),
    T.Q4_1: _q32("Q4_1", 20,
        lambda a, o, xq, xd, xs, n, r, nb: q32.mv_q4(o, a[0], a[1], a[2], xq, xd, xs, n, r, nb, True),
        lambda a, wt, g0, n, nb: deq.deq_q4(wt, a[0], a[1], a[2], g0, n, nb, True)),
    T.Q5_0: _q32("Q5_0", 22,
        lambda a, o, xq, xd, xs, n, r, nb: q32.mv_q5(o, a[0], a[1], a[2], a[2], xq, xd, xs, n, r, nb, False),
        lambda a, wt, g0, n, nb: deq.deq_q5(wt, a[0], a[1], a[2], a[2], g0, n, nb, False)),
    T.Q5_1: _q32("Q5_1", 24,
        lambda a, o, xq, xd, xs, n, r, nb: q32.mv_q5(o, a[0], a[1], a[2], a[3], xq, xd, xs, n, r, nb, True),
        lambda a, wt, g0, n, nb: deq.deq_q5(wt, a[0], a[1], a[2], a[3], g0, n, nb, True)),
    T.Q8_0: _q32("Q8_0", 34,
        lambda a, o, xq, xd, xs, n, r, nb: q32.mv_q8(o, a[0], a[1], xq, xd, n, r, nb),
        lambda a, wt, g0, n, nb: deq.deq_q8(wt, a[0], a[1], g0, n, nb)),
    T.Q2_K: _kq("Q2_K", 84,
        lambda a, o, xq, xd, xs, n, r, nb: kq.mv_q2k(o, a[0], a[1], a[2], a[3], xq, xd, xs, n, r, nb),
        lambda a, wt, g0, n, nb: deq.deq_q2k(wt, a[0], a[1], a[2], a[3], g0, n, nb)),
    T.Q3_K: _kq("Q3_K", 110,
        lambda a, o, xq, xd, xs, n, r, nb: kq.mv_q3k(o, a[0], a[1], a[2], a[3], xq, xd, n, r, nb),
        lambda a, wt, g0, n, nb: deq.deq_q3k(wt, a[0], a[1], a[2], a[3], g0, n, nb)),
    T.Q4_K: _kq("Q4_K", 144,
        lambda a, o, xq, xd, xs, n, r, nb: kq.mv_q45k(o, a[0], a[0], a[1], a[2], a[3], a[4], xq, xd, xs, n, r, nb, False),
        lambda a, wt, g0, n, nb: deq.deq_q45k(wt, a[0], a[0], a[1], a[2], a[3], a[4], g0, n, nb, False)),
    T.Q5_K: _kq("Q5_K", 176,
        lambda a, o, xq, xd, xs, n, r, nb: kq.mv_q45k(o, a[0], a[1], a[2], a[3], a[4], a[5], xq, xd, xs, n, r, nb, True),
        lambda a, wt, g0, n, nb: deq.deq_q45k(wt, a[0], a[1], a[2], a[3], a[4], a[5], g0, n, nb, True)),
    T.Q6_K: _kq("Q6_K", 210,
        lambda a, o, xq, xd, xs, n, r, nb: kq.mv_q6k(o, a[0], a[1], a[2], a[3], xq, xd, n, r, nb),
        lambda a, wt, g0, n, nb: deq.deq_q6k(wt, a[0], a[1], a[2], a[3], g0, n, nb)),
    T.F16: _Spec(1, 2, "f32", lambda raw, r, c: _as_words(raw, r, c, np.uint16), None, None),
    T.BF16: _Spec(1, 2, "f32", lambda raw, r, c: _as_words(raw, r, c, np.uint16), None, None),
    T.F32: _Spec(1, 4, "f32", lambda raw, r, c: _as_words(raw, r, c, np.float32), None, None),
}
# fmt: on

SUPPORTED_TYPES: frozenset[T] = frozenset(_SPECS)


class Activations:
    """A batch ``x[n, cols]`` of f32 activations plus its Q8_0 / Q8_K quantizations, computed on first use.

    Pass the same ``Activations`` to every matrix that multiplies the same input (q/k/v, gate/up): the
    input is quantized once per format, not once per matrix. Buffers are allocated for ``max_tokens`` rows
    once; ``set`` never allocates.
    """

    def __init__(self, cols: int, max_tokens: int = 1) -> None:
        self.cols = cols
        self.max_tokens = max_tokens
        self.n = 0
        self.x = np.zeros((max_tokens, cols), np.float32)
        self._xq = np.zeros((max_tokens, cols), np.int8)
        self._q8_0 = (
            np.zeros((max_tokens, cols // 32), np.float32),
            np.zeros((max_tokens, cols // 16), np.int32),
        )
        self._q8_k = (
            np.zeros((max_tokens, cols // 256), np.float32),
            np.zeros((max_tokens, cols // 16), np.int32),
        )
        self._x0 = self.x[0]
        self._have = ""

    def set(self, x: np.ndarray) -> Activations:
        """Load ``x`` ([cols] or [n, cols], n <= max_tokens) and forget earlier quantizations."""
        if x.ndim == 1:
            np.copyto(self._x0, x)
            self.n = 1
        else:
            n = x.shape[0]
            if n > self.max_tokens:
                raise ValueError(f"{n} tokens > max_tokens={self.max_tokens}")
            self.x[:n] = x
            self.n = n
        self._have = ""
        return self

    def quantized(self, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(xq[n, cols] int8, xd[n, cols/block] f32 scales, xs[n, cols/group] int32 quant sums) for
        kind "q8_0" (block 32) or "q8_k" (block 256); sums are over groups of 16 values."""
        n = self.n
        xq, xd, xs = self._quantized(kind)
        return xq[:n], xd[:n], xs[:n]

    def _quantized(self, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As ``quantized`` but the whole max_tokens buffers (the kernels take n separately)."""
        xd, xs = self._q8_0 if kind == "q8_0" else self._q8_k
        if self._have != kind:
            block = 32 if kind == "q8_0" else 256
            group = 16  # sums per 16 values: the int16 kernels start their accumulators from them
            quantize_q8(self._xq, xd, xs, self.x, self.n, self.cols, block, group)
            self._have = kind
        return self._xq, xd, xs


_scratch = threading.local()


def _slab(size: int, which: int = 0) -> np.ndarray:
    """Per-thread f32 scratch buffer ``which`` (0: weight slab, 1: slab result) of at least ``size`` values,
    reused across calls and matrices."""
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None:
        bufs = _scratch.bufs = [np.empty(0, np.float32), np.empty(0, np.float32)]
    if bufs[which].size < size:
        bufs[which] = np.empty(size, np.float32)
    return bufs[which][:size]


class QuantMatrix:
    """A weight matrix ``W[rows, cols]`` stored in ggml type ``qtype``, ready for products with f32 inputs.

    ``raw`` is the tensor's bytes in ggml's layout (``rows`` rows of ``cols / block`` blocks; a zero-copy
    view of the GGUF mmap is fine). Quantized types are repacked at construction into tiles of 64 rows
    (about the size of ``raw``: scales widen to f32; ``raw`` is not referenced afterwards). F16/BF16/F32 keep
    a view of ``raw``.
    """

    def __init__(self, raw: np.ndarray, qtype: T | int, rows: int, cols: int) -> None:
        self.qtype = T(qtype)
        if self.qtype not in _SPECS:
            raise ValueError(f"no kernel for {self.qtype.name}")
        spec = _SPECS[self.qtype]
        if cols % spec.block:
            raise ValueError(f"{self.qtype.name} needs cols divisible by {spec.block}, got {cols}")
        flat = np.asarray(raw).reshape(-1).view(np.uint8)
        if flat.size != rows * cols // spec.block * spec.block_bytes:
            raise ValueError(f"{flat.size} bytes do not hold a {rows}x{cols} {self.qtype.name} matrix")
        self.rows, self.cols = rows, cols
        self.activation = spec.act
        self._spec = spec
        self._nb = cols // spec.block
        self._arrays = spec.pack(flat.reshape(rows, -1), rows, cols)
        self._acts: Activations | None = None
        self._acts1 = Activations(cols, 1)  # matvec's own input buffers

    @classmethod
    def from_gguf(cls, f: gguf_io.GGUFFile, name: str) -> QuantMatrix:
        """The 2-D tensor ``name`` of an open GGUF file (ggml shape (cols, rows): ne0 is the row length)."""
        info = f.tensors[name]
        cols = info.shape[0]
        rows = math.prod(info.shape[1:])
        return cls(f.tensor_bytes(name), info.ggml_type, rows, cols)

    @property
    def nbytes(self) -> int:
        """Bytes held by the (repacked) weights."""
        return sum(a.nbytes for a in self._arrays)

    def matvec(self, x: np.ndarray | Activations, out: np.ndarray | None = None) -> np.ndarray:
        """y[rows] = W @ x for x: [cols] f32 (or a one-token ``Activations``); writes ``out`` if given."""
        if out is None:
            out = np.empty(self.rows, np.float32)
        elif out.shape != (self.rows,) or out.dtype != np.float32:
            raise ValueError(f"out must be float32 [{self.rows}], got {out.dtype} {out.shape}")
        spec = self._spec
        if spec.mv is None:
            self.matmul(x, out.reshape(1, self.rows))
            return out
        # the decode hot path: no slicing or reshaping beyond the one view of out
        if isinstance(x, Activations):
            acts = x
            self._check_acts(acts)
        else:
            acts = self._acts1.set(x)
        xq, xd, xs = acts._quantized(spec.act)
        spec.mv(self._arrays, out.reshape(1, self.rows), xq, xd, xs, 1, self.rows, self._nb)
        return out

    def matmul(self, x: np.ndarray | Activations, out: np.ndarray | None = None) -> np.ndarray:
        """Y[n, rows] = X[n, cols] @ W.T for X f32 (or an ``Activations``); writes ``out`` if given."""
        acts = x if isinstance(x, Activations) else None
        if acts is not None:
            self._check_acts(acts)
            xf = acts.x[: acts.n]
        else:
            xf = np.asarray(x, np.float32).reshape(-1, self.cols)
        n = xf.shape[0]
        if out is None:
            out = np.empty((n, self.rows), np.float32)
        elif out.shape != (n, self.rows) or out.dtype != np.float32:
            raise ValueError(f"out must be float32 [{n}, {self.rows}], got {out.dtype} {out.shape}")
        if self.qtype == T.F32:
            np.matmul(xf, self._arrays[0].T, out=out)
        elif self._spec.act == "f32":
            if n > BLAS_MIN_TOKENS:
                self._matmul_blas(xf, out)
            else:
                floats.mv_f16(
                    out,
                    self._arrays[0],
                    np.ascontiguousarray(xf),
                    n,
                    self.rows,
                    self.cols,
                    self.qtype == T.BF16,
                )
        elif n > BLAS_MIN_TOKENS:
            self._matmul_blas(xf, out)
        else:
            if acts is None:
                acts = self._own_activations(xf)
            xq, xd, xs = acts._quantized(self._spec.act)
            mv = self._spec.mv
            assert mv is not None  # every quantized type has one
            mv(self._arrays, out, xq, xd, xs, n, self.rows, self._nb)
        return out

    def _check_acts(self, acts: Activations) -> None:
        # the kernels do not bounds-check: a narrower input would be read past its end
        if acts.cols != self.cols or acts.n < 1:
            raise ValueError(f"activations of {acts.n}x{acts.cols} for a matrix of {self.cols} columns")

    def _own_activations(self, xf: np.ndarray) -> Activations:
        n = xf.shape[0]
        if self._acts is None or self._acts.max_tokens < n:
            self._acts = Activations(self.cols, max(n, 1))
        return self._acts.set(xf)

    def _matmul_blas(self, xf: np.ndarray, out: np.ndarray) -> None:
        """Dequantize slabs of rows to f32 and let BLAS do ``X @ slab``."""
        rows, cols = self.rows, self.cols
        per = max(1, _SLAB_BYTES // (cols * 4 * TILE_ROWS))  # tiles per slab
        if self._spec.deq is None:  # F16/BF16: slab is [m, cols] row-major
            step = per * TILE_ROWS
            for r0 in range(0, rows, step):
                m = min(step, rows - r0)
                w = _slab(m * cols).reshape(m, cols)
                floats.deq_f16(w, self._arrays[0], r0, m, cols, self.qtype == T.BF16)
                self._product(xf, w.T, out, r0, m)
            return
        g_all = n_tiles(rows)
        for g0 in range(0, g_all, per):
            ng = min(per, g_all - g0)
            wt = _slab(cols * ng * TILE_ROWS).reshape(cols, ng * TILE_ROWS)
            self._spec.deq(self._arrays, wt, g0, ng, self._nb)
            r0 = g0 * TILE_ROWS
            m = min(ng * TILE_ROWS, rows - r0)
            self._product(xf, wt[:, :m], out, r0, m)

    def _product(self, xf: np.ndarray, w: np.ndarray, out: np.ndarray, r0: int, m: int) -> None:
        """out[:, r0:r0+m] = xf @ w. numpy only calls BLAS for a contiguous output, so a slab that is not
        the whole output goes through a contiguous scratch (a strided ``out=`` fell back to a loop 30x
        slower)."""
        if m == self.rows:
            np.matmul(xf, w, out=out)
            return
        res = _slab(xf.shape[0] * m, 1).reshape(xf.shape[0], m)
        np.matmul(xf, w, out=res)
        out[:, r0 : r0 + m] = res
