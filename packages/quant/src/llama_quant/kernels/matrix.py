"""ExactMatrix: one weight matrix in a ggml type whose products with f32 activations equal llama.cpp's CPU
results bit for bit (ggml's generic C kernels: the activations quantized to the type's vec_dot type with the
reference quantizer, then one ``vec_dot`` per output element).

A batch gives, row by row, exactly the numbers of one ``matvec`` per token (ggml's mul_mat calls the same
vec_dot per element), so results do not depend on how tokens are batched. The kernels come from the kernel
set the matrix is built with (``llama_quant.cpu.KernelSet``), one table per set built once (``_SPECS``):
PORTABLE runs ``blocks32``, ``kquants`` and ``floats`` (plain loops, any CPU); AVX2 runs Q4_0, Q4_1,
Q5_0, Q5_1 and Q8_0 through ``pairs`` and Q4_K and Q6_K through ``klanes``' 256-bit lanes, for every token
count (byte-pair multiply-adds on tiles stored at load in the order those kernels read: other integer
arithmetic, the same sums, the same float steps); AVX512 runs Q8_0 through ``quads`` (VNNI 4-byte dot
products) for every token count, Q4_0, Q4_1, Q5_0 and Q5_1 from ``quads.QUAD_TOKENS`` tokens on, and the
K types' lanes on 512-bit vectors; both keep F16 in fp16 for ``halves``. The i-quants and ternary
types run ``iquants``' layouts in every set (IQ4_NL widened to Q8_0 rows, with the set's Q8_0 kernels).

F16, BF16 and F32 are the exception unless the matrix is exact (``exact=True`` or ``LLAMA_EXACT_FLOATS``,
``llama_quant.cpu.resolve_exact_floats``): by default they run ``fast_floats``, f32 sums in vector lanes as
llama.cpp's native build (``_FAST_SPECS``), still independent of how tokens are batched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from ..cpu import KernelSet, resolve_exact_floats, resolve_kernel_set
from . import act, blocks32, fast_floats, floats, halves, iquants, klanes, kquants, pairs, quads
from ._ir import f16_scales
from ._tiles import TILE_ROWS, n_tiles
from .ref import vec_dot_type

if TYPE_CHECKING:
    import gguf_io

__all__ = ["SUPPORTED_TYPES", "Activations", "ExactMatrix"]

_PARALLEL_ROWS = 8  # from this many tokens on, activations are quantized on all threads
_NEVER = 1 << 62  # a token count no call reaches
# Raw bytes of the rows repacked (or widened) at a time: the repacking's numpy temporaries stay a few times
# this, so loading on many threads keeps little freed memory in their allocator arenas, and a large matrix
# (a 262k-token output) never has several whole-size copies alive at once.
PACK_CHUNK_BYTES = 1 << 18


class Activations:
    """A batch ``x[n, cols]`` of f32 activations and its vec_dot-type conversions, each made on first use.

    Pass the same ``Activations`` to every matrix that multiplies the same input (q/k/v, gate/up): the input
    is quantized once per format, not once per matrix. Buffers are allocated for ``max_tokens`` rows once;
    ``set`` never allocates. Formats: "q8" (Q8_0 and Q8_1 together), "q8k", "f16", "bf16", "f32".
    """

    def __init__(self, cols: int, max_tokens: int = 1) -> None:
        self.cols = cols
        self.max_tokens = max_tokens
        self.n = 0
        self.x = np.zeros((max_tokens, cols), np.float32)
        self._x0 = self.x[0]
        self._bufs: dict[str, tuple[np.ndarray, ...]] = {}
        self._have: set[str] = set()

    def set(self, x: np.ndarray) -> Activations:
        """Load ``x`` ([cols] or [n, cols], n <= max_tokens) and forget earlier conversions."""
        if x.ndim == 1:
            np.copyto(self._x0, x)
            self.n = 1
        else:
            n = x.shape[0]
            if n > self.max_tokens:
                raise ValueError(f"{n} tokens > max_tokens={self.max_tokens}")
            self.x[:n] = x
            self.n = n
        self._have.clear()
        return self

    def rows(self, n: int) -> np.ndarray:
        """The f32 buffer's first ``n`` rows, to compute the next input straight into (instead of ``set``);
        earlier conversions are forgotten."""
        if n > self.max_tokens:
            raise ValueError(f"{n} tokens > max_tokens={self.max_tokens}")
        self.n = n
        self._have.clear()
        return self.x[:n]

    def converted(self, fmt: str) -> tuple[np.ndarray, ...]:
        """The whole ``max_tokens`` buffers of format ``fmt`` (valid for the first ``n`` rows):
        q8: (xq int8 [., cols], xd f32 fp16(d) [., cols/32], xs f32 fp16(s) [., cols/32], xsum int32 [., cols/16]);
        q8k: (xq, xd f32 [., cols/256], xsum int32 [., cols/16]); f16 / bf16 / f32: (x f32 [., cols],)."""
        if fmt in self._have:
            return self._bufs[fmt]
        if fmt == "f32":
            return (self.x,)
        m, c, n = self.max_tokens, self.cols, self.n
        bufs = self._bufs.get(fmt)
        if bufs is None:
            if fmt == "q8":
                bufs = (
                    np.zeros((m, c), np.int8),
                    np.zeros((m, c // 32), np.float32),
                    np.zeros((m, c // 32), np.float32),
                    np.zeros((m, c // 16), np.int32),
                )
            elif fmt == "q8k":
                bufs = (
                    np.zeros((m, c), np.int8),
                    np.zeros((m, c // 256), np.float32),
                    np.zeros((m, c // 16), np.int32),
                )
            else:
                bufs = (np.zeros((m, c), np.float32),)
            self._bufs[fmt] = bufs
        many = n >= _PARALLEL_ROWS
        if fmt == "q8":
            (act.quantize_q8_rows if many else act.quantize_q8)(
                bufs[0], bufs[1], bufs[2], bufs[3], self.x, n, c
            )
        elif fmt == "q8k":
            (act.quantize_q8_k_rows if many else act.quantize_q8_k)(bufs[0], bufs[1], bufs[2], self.x, n, c)
        elif fmt == "f16":
            act.quantize_f16(bufs[0], self.x, n, c)
        else:
            act.quantize_bf16(bufs[0], self.x, n, c)
        self._have.add(fmt)
        return bufs


@dataclass(frozen=True, slots=True)
class _Spec:
    block: int  # values per block (1 for floats)
    block_bytes: int
    fmt: str  # Activations format
    pack: Callable[[np.ndarray, int, int], tuple[np.ndarray, ...]]
    run: Callable[..., None]  # (arrays, out, acts tuple, n, rows, nb)
    # experts stacked by whole tiles, one launch for all (``ExpertMatrix``):
    # (arrays, out, acts tuple, n, rows per expert, nb, pairs, offsets, active, m, div); None: one run each
    run_experts: Callable[..., None] | None = None


def _q4(name: str, ks: KernelSet) -> _Spec:
    """Q4_0 (no min) and Q4_1. From AVX2 on the nibbles are regrouped at load (``pairs.q4_pair_layout``) and
    ``pairs.mm_q4`` serves every token count (AVX-512: ``quads.mm_q4`` from ``quads.QUAD_TOKENS`` on);
    portable: ``blocks32.mv_q4`` on ``blocks32``'s tiles."""
    has_min = name == "Q4_1"
    portable = ks is KernelSet.PORTABLE
    few = blocks32.mv_q4 if portable else pairs.mm_q4
    many, many_from = (quads.mm_q4, quads.QUAD_TOKENS) if ks >= KernelSet.AVX512 else (few, _NEVER)

    def pack(raw: np.ndarray, r: int, c: int) -> tuple[np.ndarray, ...]:
        arrays = blocks32.pack(name, raw, r, c)
        if portable:
            return arrays
        return (pairs.q4_pair_layout(arrays[0], c // 32), *map(f16_scales, arrays[1:]))

    def run(
        a: tuple[np.ndarray, ...], o: np.ndarray, x: tuple[np.ndarray, ...], n: int, r: int, nb: int
    ) -> None:
        m = a[2] if has_min else a[1]  # Q4_0: d in the min's place, never read
        (many if n >= many_from else few)(o, a[0], a[1], m, *x, n, r, nb, has_min)  # type: ignore[call-arg]

    return _Spec(32, blocks32.BLOCK_BYTES[name], "q8", pack, run)


def _q5(name: str, ks: KernelSet) -> _Spec:
    """Q5_0 and Q5_1. From AVX2 on the low nibbles are stored as Q4's and the fifth bits as bit planes
    (``pairs.q5_pair_layout``), and one kernel serves every token count (AVX-512: ``quads.mm_q5`` from
    ``quads.QUAD_TOKENS`` on). Portable: Q5_0 runs as the Q8_0 it widens to (``_q8``), Q5_1 on its raw
    blocks (``blocks32.mv_q5``)."""
    has_min = name == "Q5_1"
    bb = blocks32.BLOCK_BYTES[name]
    if ks is KernelSet.PORTABLE:
        if not has_min:
            return _q8(name, ks)
        return _Spec(
            32,
            bb,
            "q8",
            lambda raw, r, c: blocks32.pack(name, raw, r, c),
            lambda a, o, x, n, r, nb: blocks32.mv_q5(o, *a, *x, n, r, nb, True),  # type: ignore[call-arg]
        )
    many, many_from = (quads.mm_q5, quads.QUAD_TOKENS) if ks >= KernelSet.AVX512 else (pairs.mm_q5, _NEVER)

    def pack(raw: np.ndarray, r: int, c: int) -> tuple[np.ndarray, ...]:
        qs, qh, d, *m = blocks32.pack(name, raw, r, c)
        scales = f16_scales(d), f16_scales(m[0]) if m else np.zeros(0, np.uint16)
        return (*pairs.q5_pair_layout(qs, qh, c // 32), *scales)

    def run(
        a: tuple[np.ndarray, ...], o: np.ndarray, x: tuple[np.ndarray, ...], n: int, r: int, nb: int
    ) -> None:
        m = a[3] if has_min else a[2]  # Q5_0: d in the min's place, never read
        kernel = many if n >= many_from else pairs.mm_q5
        kernel(o, a[0], a[1], a[2], m, *x, n, r, nb, has_min)  # type: ignore[call-arg]

    return _Spec(32, bb, "q8", pack, run)


_AS_Q8_0 = {"Q5_0": blocks32.q5_0_as_q8_0, "IQ4_NL": iquants.iq4_nl_as_q8_0}


def _q8(name: str, ks: KernelSet) -> _Spec:
    """Q8_0, and Q5_0 and IQ4_NL run as the Q8_0 they widen to at load (34 bytes a block instead of 22 or
    18: portable, and where Q5_0 rows stack with Q8_0 ones). AVX2 stores the tiles in byte pairs
    (``pairs.q8_pair_layout``), AVX-512 in quads (``quads.q8_quad_layout``); one kernel serves every token
    count."""

    def pack(raw: np.ndarray, r: int, c: int) -> tuple[np.ndarray, ...]:
        if name in _AS_Q8_0:
            raw = _AS_Q8_0[name](raw, r, c)
        qs, d = blocks32.pack("Q8_0", raw, r, c)
        if ks is KernelSet.PORTABLE:
            return qs, d
        layout = quads.q8_quad_layout if ks >= KernelSet.AVX512 else pairs.q8_pair_layout
        return layout(qs, c // 32), f16_scales(d)

    if ks >= KernelSet.AVX512:
        run = lambda a, o, x, n, r, nb: quads.mm_q8(o, a[0], a[1], x[0], x[1], x[3], n, r, nb)  # noqa: E731
    elif ks is KernelSet.AVX2:
        run = lambda a, o, x, n, r, nb: pairs.mm_q8(o, a[0], a[1], x[0], x[1], n, r, nb)  # noqa: E731
    else:
        run = lambda a, o, x, n, r, nb: blocks32.mv_q8(o, a[0], a[1], x[0], x[1], n, r, nb)  # noqa: E731
    return _Spec(32, GGML_QUANT_SIZES[T[name]][1], "q8", pack, run)


def _iq(qtype: T) -> _Spec:
    """The i-quants and ternary types not widened to Q8_0 (``iquants``): the same kernels in every set."""
    bb = GGML_QUANT_SIZES[qtype][1]
    if qtype == T.MXFP4:  # portable Q8_0 tiles with f32 scales (an e8m0 scale may not fit fp16)
        mv = lambda a, o, x, n, r, nb: blocks32.mv_q8(o, *a, x[0], x[1], n, r, nb)  # type: ignore[call-arg]  # noqa: E731
        return _Spec(32, bb, "q8", iquants.mxfp4_q8_tiles, mv)
    grid = qtype != T.IQ4_XS
    pk = lambda raw, r, c: iquants.pack_iq(qtype, raw, r, c)  # noqa: E731
    return _Spec(256, bb, "q8k", pk, lambda a, o, x, n, r, nb: iquants.mv_iq(o, *a, *x, n, r, nb, grid))  # type: ignore[call-arg]


def _k(qtype: T, bb: int, ks: KernelSet) -> _Spec:
    """The K types: from AVX2 on, Q4_K and Q6_K are stored for the lane kernels (``klanes``: 256-bit
    vectors under AVX2, 512-bit under AVX-512) for every token count; the rest run ``kquants``."""
    if qtype in (T.Q4_K, T.Q6_K) and ks is not KernelSet.PORTABLE:
        pk = lambda raw, r, c: klanes.k_pair_layout(qtype, kquants.pack(qtype, raw, r, c), c // 256)  # noqa: E731
        wide, q6 = ks >= KernelSet.AVX512, qtype == T.Q6_K
        mm = klanes.mm_k512 if wide else klanes.mm_k256
        mx = klanes.mm_k512_experts if wide else klanes.mm_k256_experts
        return _Spec(
            256,
            bb,
            "q8k",
            pk,
            lambda a, o, x, n, r, nb: mm(o, *a, *x, n, r, nb, q6),  # type: ignore[call-arg]
            lambda a, o, x, n, r, nb, *grouping: mx(o, *a, *x, n, r, nb, q6, *grouping),  # type: ignore[call-arg]
        )
    pk = lambda raw, r, c: kquants.pack(qtype, raw, r, c)  # noqa: E731
    kind = kquants.KIND[qtype]
    if qtype == T.Q4_K:
        run = lambda a, o, x, n, r, nb: kquants.mv_q4k(o, *a, *x, n, r, nb)  # type: ignore[call-arg]  # noqa: E731
    else:
        run = lambda a, o, x, n, r, nb: kquants.mv_k8(o, *a, *x, n, r, nb, kind)  # type: ignore[call-arg]  # noqa: E731
    return _Spec(256, bb, "q8k", pk, run)


def _f(qtype: T, bb: int, fmt: str, ks: KernelSet, fast: bool = False) -> _Spec:
    """F16, BF16, F32: ``floats``' f32 tiles; from AVX2 on, F16 stays fp16 (the F16C widening). Exact: f64
    sums (``floats.mv_float``, ``halves.mm_f16``); ``fast``: f32 sums on the same tiles (``fast_floats``)."""
    if qtype == T.F16 and ks is not KernelSet.PORTABLE:
        if fast:
            run = lambda a, o, x, n, r, nb: fast_floats.mm_fast(o, a[0], x[0], n, r, nb, True)  # noqa: E731
        else:
            run = lambda a, o, x, n, r, nb: halves.mm_f16(o, a[0], x[0], n, r, nb)  # noqa: E731
        return _Spec(1, bb, fmt, halves.pack_f16, run)
    if fast:
        run = lambda a, o, x, n, r, nb: fast_floats.mm_fast(o, a[0], x[0], n, r, nb, False)  # noqa: E731
    else:
        run = lambda a, o, x, n, r, nb: floats.mv_float(o, a[0], x[0], n, r, nb)  # noqa: E731
    return _Spec(1, bb, fmt, lambda raw, r, c: floats.pack(qtype, raw, r, c), run)


_FLOATS = ((T.F16, 2, "f16"), (T.BF16, 2, "bf16"), (T.F32, 4, "f32"))  # (type, bytes a value, activations)


def _specs(ks: KernelSet) -> dict[T, _Spec]:
    """Every supported type's layout and kernels under the kernel set ``ks``."""
    return {
        T.Q4_0: _q4("Q4_0", ks),
        T.Q4_1: _q4("Q4_1", ks),
        T.Q5_0: _q5("Q5_0", ks),
        T.Q5_1: _q5("Q5_1", ks),
        T.Q8_0: _q8("Q8_0", ks),
        T.Q2_K: _k(T.Q2_K, 84, ks),
        T.Q3_K: _k(T.Q3_K, 110, ks),
        T.Q4_K: _k(T.Q4_K, 144, ks),
        T.Q5_K: _k(T.Q5_K, 176, ks),
        T.Q6_K: _k(T.Q6_K, 210, ks),
        **{q: _f(q, bb, fmt, ks) for q, bb, fmt in _FLOATS},
        T.IQ4_NL: _q8("IQ4_NL", ks),
        **{q: _iq(q) for q in (T.MXFP4, T.IQ4_XS, *iquants.GRID_KINDS)},
    }


# Built once: a table per kernel set. Nothing is compiled until a kernel first runs, so the sets a host
# cannot run cost nothing (and are refused by ``resolve_kernel_set`` before they are used).
_SPECS: dict[KernelSet, dict[T, _Spec]] = {ks: _specs(ks) for ks in KernelSet}
# the float types' fast kernels (``resolve_exact_floats``): f32 sums instead of the portable build's f64
_FAST_SPECS: dict[KernelSet, dict[T, _Spec]] = {
    ks: {q: _f(q, bb, fmt, ks, fast=True) for q, bb, fmt in _FLOATS} for ks in KernelSet
}

SUPPORTED_TYPES: frozenset[T] = frozenset(_SPECS[KernelSet.PORTABLE])
# types whose rows convert exactly to another type's (to stack with them): ``_AS_Q8_0``'s
_WIDENS_TO = {T.Q5_0: T.Q8_0, T.IQ4_NL: T.Q8_0}


def _raw_bytes(raw: np.ndarray, qtype: T, rows: int, cols: int) -> np.ndarray:
    """``raw`` as flat bytes, checked to hold a ``rows`` x ``cols`` matrix of ``qtype`` (a supported type)."""
    spec = _SPECS[KernelSet.PORTABLE][qtype]  # block sizes are the same in every kernel set
    if cols % spec.block:
        raise ValueError(f"{qtype.name} needs cols divisible by {spec.block}, got {cols}")
    flat = np.asarray(raw).reshape(-1).view(np.uint8)
    if flat.size != rows * cols // spec.block * spec.block_bytes:
        raise ValueError(f"{flat.size} bytes do not hold a {rows}x{cols} {qtype.name} matrix")
    return flat


def _chunk_rows(row_bytes: int) -> int:
    """Rows of ``row_bytes`` each repacked at a time: whole tiles, about ``PACK_CHUNK_BYTES``."""
    return max(1, PACK_CHUNK_BYTES // (row_bytes * TILE_ROWS)) * TILE_ROWS


def _pack_by_chunks(
    pack: Callable[[np.ndarray, int, int], tuple[np.ndarray, ...]], raw: np.ndarray, rows: int, cols: int
) -> tuple[np.ndarray, ...]:
    """``pack(raw, rows, cols)``, built a chunk of whole tiles at a time into arrays allocated once.

    Every layout is tile-major: each array's first axis is the tiles of 64 rows (the last one
    zero-padded), and a tile's bytes depend on its own rows only, so the chunks' arrays laid end to end
    along that axis are the whole matrix's. An array without that axis (an empty placeholder) is kept from
    the first chunk. Each array starts on a 64-byte boundary, as ``quads`` wants its rows (their length a
    multiple of 64 bytes)."""
    step = _chunk_rows(raw.shape[1])
    if rows <= step:
        return pack(raw, rows, cols)
    first = pack(raw[:step], step, cols)
    g_step = step // TILE_ROWS
    out = []
    for a in first:
        if a.ndim == 0 or a.shape[0] != g_step:
            if a.size:
                raise AssertionError(f"a layout array of shape {a.shape} is not tile-major")
            out.append(a)
            continue
        b = _aligned_empty((n_tiles(rows), *a.shape[1:]), a.dtype)
        b[:g_step] = a
        out.append(b)
    del first
    for r in range(step, rows, step):
        n = min(step, rows - r)
        g0 = r // TILE_ROWS
        for b, a in zip(out, pack(raw[r : r + n], n, cols), strict=True):
            if b.size:
                b[g0 : g0 + len(a)] = a
    return tuple(out)


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array whose data starts on a 64-byte boundary."""
    size = math.prod(shape) * dtype.itemsize
    buf = np.empty(size + 64, np.uint8)
    start = -buf.ctypes.data % 64
    return buf[start : start + size].view(dtype).reshape(shape)


class ExactMatrix:
    """A weight matrix ``W[rows, cols]`` in ggml type ``qtype`` whose products equal llama.cpp's bit for bit.

    ``raw`` is the tensor's bytes in ggml's layout (``rows`` rows of ``cols / block`` blocks; a zero-copy view
    of the GGUF mmap is fine). It is repacked at construction into tiles of 64 rows and not referenced
    afterwards (Q4_*, Q5_*, Q8_0 and Q4_K keep about the raw size; Q5_0 stacked with Q8_0, or portable, is
    widened to Q8_0, Q6_K keeps 6 bits a value, Q2_K/Q3_K/Q5_K widen quants to int8, BF16 (and F16 in the portable set) to f32;
    IQ4_NL and MXFP4 widen to Q8_0, IQ4_XS, TQ1_0, TQ2_0 and the grid i-quants to int8 values).

    ``kernels`` is the kernel set whose layouts and kernels the matrix takes (``llama_quant.cpu``); None:
    ``resolve_kernel_set(None)`` (``LLAMA_KERNELS``, else the host's best). A set the host cannot run raises
    ``ValueError``."""

    def __init__(
        self,
        raw: np.ndarray,
        qtype: T | int,
        rows: int,
        cols: int,
        kernels: KernelSet | None = None,
        exact: bool | None = None,
    ) -> None:
        self.qtype = T(qtype)
        if self.qtype not in SUPPORTED_TYPES:
            raise ValueError(f"no exact kernel for {self.qtype.name}")
        self.kernels = resolve_kernel_set(kernels)
        # F16 / BF16 / F32: the portable build's bits, or f32 sums (``llama_quant.cpu.resolve_exact_floats``)
        self.exact = resolve_exact_floats(exact)
        spec = _SPECS[self.kernels][self.qtype]
        if not self.exact:
            spec = _FAST_SPECS[self.kernels].get(self.qtype, spec)
        flat = _raw_bytes(raw, self.qtype, rows, cols)
        self.rows, self.cols = rows, cols
        self.vec_dot_type = vec_dot_type(self.qtype)
        self._spec = spec
        self._nb = cols // spec.block
        self._arrays = _pack_by_chunks(spec.pack, flat.reshape(rows, -1), rows, cols)
        self._acts: Activations | None = None
        self._acts1 = Activations(cols, 1)  # matvec's own input buffers

    @classmethod
    def from_gguf(cls, f: gguf_io.GGUFFile, name: str, kernels: KernelSet | None = None) -> ExactMatrix:
        """The 2-D tensor ``name`` of an open GGUF file (ggml shape (cols, rows): ne0 is the row length)."""
        info = f.tensors[name]
        return cls(f.tensor_bytes(name), info.ggml_type, math.prod(info.shape[1:]), info.shape[0], kernels)

    @classmethod
    def stacked(
        cls,
        parts: Sequence[tuple[np.ndarray, T | int, int]],
        cols: int,
        kernels: KernelSet | None = None,
        exact: bool | None = None,
    ) -> ExactMatrix | None:
        """One matrix holding the rows of ``parts`` (``(raw, qtype, rows)`` each, ``cols`` columns) in order:
        one kernel launch instead of several, with the same numbers (each output is its own row's product).
        Parts stack when they have one type, or are Q5_0, IQ4_NL and Q8_0 (the Q5_0 and IQ4_NL rows widened
        to Q8_0, ``blocks32.q5_0_as_q8_0``, ``iquants.iq4_nl_as_q8_0``); otherwise None."""
        kinds = {T(q) for _, q, _ in parts}
        if len(kinds) > 1:
            kinds = {_WIDENS_TO.get(q, q) for q in kinds}
        if len(kinds) != 1:
            return None
        qtype = kinds.pop()
        row_bytes = cols // GGML_QUANT_SIZES[qtype][0] * GGML_QUANT_SIZES[qtype][1]
        total = sum(rows for _, _, rows in parts)
        out = np.empty((total, row_bytes), np.uint8)
        at = 0
        for raw, q, rows in parts:
            flat = _raw_bytes(raw, T(q), rows, cols).reshape(rows, -1)
            if T(q) == qtype:
                out[at : at + rows] = flat
            else:  # Q5_0 or IQ4_NL among Q8_0 parts, widened a chunk of rows at a time
                widen = _AS_Q8_0[T(q).name]
                step = _chunk_rows(flat.shape[1])
                for r in range(0, rows, step):
                    n = min(step, rows - r)
                    out[at + r : at + r + n] = widen(flat[r : r + n], n, cols)
            at += rows
        return cls(out, qtype, total, cols, kernels, exact)

    @property
    def nbytes(self) -> int:
        """Bytes held by the repacked weights."""
        return sum(a.nbytes for a in self._arrays)

    @property
    def activation_format(self) -> str:
        """The ``Activations`` format this matrix reads ("q8", "q8k", "f16", "bf16" or "f32")."""
        return self._spec.fmt

    def quantize_input(self, x: np.ndarray) -> Activations:
        """``x`` ([cols] or [n, cols]) converted once to this matrix's vec_dot type, for reuse by every matrix
        with the same input (any matrix accepts it; other formats are converted on first use)."""
        x = np.asarray(x, np.float32)
        acts = Activations(self.cols, 1 if x.ndim == 1 else x.shape[0]).set(x)
        acts.converted(self._spec.fmt)
        return acts

    def matvec(self, x: np.ndarray | Activations, out: np.ndarray | None = None) -> np.ndarray:
        """y[rows] = W @ x for x: [cols] f32 (or a one-token ``Activations``); writes ``out`` if given."""
        if out is None:
            out = np.empty(self.rows, np.float32)
        elif out.shape != (self.rows,) or out.dtype != np.float32:
            raise ValueError(f"out must be float32 [{self.rows}], got {out.dtype} {out.shape}")
        if isinstance(x, Activations):
            acts = x
            self._check_acts(acts)
        else:
            acts = self._acts1.set(np.asarray(x, np.float32).reshape(self.cols))
        self._spec.run(
            self._arrays, out.reshape(1, self.rows), acts.converted(self._spec.fmt), 1, self.rows, self._nb
        )
        return out

    def matmul(self, x: np.ndarray | Activations, out: np.ndarray | None = None) -> np.ndarray:
        """Y[n, rows] = X[n, cols] @ W.T for X f32 (or an ``Activations``); writes ``out`` if given."""
        if isinstance(x, Activations):
            acts = x
            self._check_acts(acts)
        else:
            xf = np.asarray(x, np.float32).reshape(-1, self.cols)
            acts = self._own_activations(xf)
        n = acts.n
        if out is None:
            out = np.empty((n, self.rows), np.float32)
        elif out.shape != (n, self.rows) or out.dtype != np.float32:
            raise ValueError(f"out must be float32 [{n}, {self.rows}], got {out.dtype} {out.shape}")
        self._spec.run(self._arrays, out, acts.converted(self._spec.fmt), n, self.rows, self._nb)
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
