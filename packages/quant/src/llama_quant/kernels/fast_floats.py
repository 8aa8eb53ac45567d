"""Fast kernels for unquantized weights F16, BF16, F32: f32 sums in vector lanes, as llama.cpp's native build.

The exact kernels (``floats``, ``halves``) give the bits of ggml's portable build: every product added to an
f64 sum in index order. llama.cpp's native build sums in f32 SIMD lanes instead, and so do these: each
output's products (weight widened to f32 times the activation, already rounded to the weights' type as
ggml's vec_dot type asks) are added in index order to an f32 sum with a multiply-add, 16 outputs to a vector.
The results differ from the exact ones by f32 rounding of the running sums (about 1e-7 relative to the sum
of the products' magnitudes); they do not depend on how tokens are batched.

Half the arithmetic width of f64 lanes doubles what a vector instruction does and the fp16 weights widen in
one instruction instead of two, so a pass over a tile for several tokens costs little more than one: a
verified draft or a prompt chunk is bounded by reading the weights, not by the sums. The tiles are the exact
kernels' (``_tiles``: element i of row r at ``i * 64 + r``): fp16 for F16 (``halves.pack_f16``), f32 for F32
and BF16 (``floats.pack``).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._tiles import N_CHUNKS, TILE_ROWS

__all__ = ["mm_fast"]

_F32 = ir.FloatType()
_LANES = 16
_V16F, _V16H = ir.VectorType(_F32, _LANES), ir.VectorType(ir.HalfType(), _LANES)
_BLOCK = 4  # tokens of a pass against half a tile (what is left: two, then one, against a whole tile)


def _fmuladd(builder):  # type: ignore[no-untyped-def]
    """LLVM's multiply-add of 16 x f32 (fused where the target has FMA)."""
    module = builder.module
    name = "llvm.fmuladd.v16f32"
    return module.globals.get(name) or ir.Function(module, ir.FunctionType(_V16F, [_V16F] * 3), name)


def _pass(lanes: int, tokens: int, half: bool):  # type: ignore[no-untyped-def]
    """An intrinsic ``(res, w, roff, x, xoff, cols)``: for ``tokens`` tokens (x f32, token t's values at
    ``x[xoff + t * cols:]``) and the ``lanes`` rows of the tile ``w`` (fp16 bits when ``half``, else f32) from
    row ``roff``, the f32 sums over the ``cols`` columns in index order into ``res[t * lanes + r]``."""
    groups = lanes // _LANES
    wvec = _V16H if half else _V16F

    @intrinsic
    def run(typingctx, res, w, roff, x, xoff, cols):  # type: ignore[no-untyped-def]
        sig = types.void(res, w, types.intp, x, types.intp, types.intp)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            arrays = [context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 1, 3)]
            res_p, w_p, x_p = (a.data for a in arrays)
            roff, xoff, cols = args[2], args[4], args[5]
            zero = ir.Constant(_V16F, [0.0] * _LANES)
            accs = [cgutils.alloca_once_value(builder, zero) for _ in range(tokens * groups)]
            lane0 = ir.Constant(ir.IntType(32), 0)
            spread = ir.Constant(ir.VectorType(ir.IntType(32), _LANES), [0] * _LANES)
            with cgutils.for_range(builder, cols) as loop:
                i = loop.index
                base = builder.add(builder.mul(i, ir.Constant(i.type, TILE_ROWS)), roff)
                ws = []
                for g in range(groups):
                    at = builder.gep(w_p, [builder.add(base, ir.Constant(i.type, _LANES * g))])
                    v = builder.load(builder.bitcast(at, wvec.as_pointer()), align=2 if half else 4)
                    ws.append(builder.fpext(v, _V16F) if half else v)
                for t in range(tokens):
                    xo = builder.add(builder.add(xoff, i), builder.mul(cols, ir.Constant(i.type, t)))
                    xi = builder.load(builder.gep(x_p, [xo]))
                    one = builder.insert_element(ir.Constant(_V16F, ir.Undefined), xi, lane0)
                    xb = builder.shuffle_vector(one, ir.Constant(_V16F, ir.Undefined), spread)
                    for g in range(groups):
                        acc = accs[t * groups + g]
                        builder.store(builder.call(_fmuladd(builder), [ws[g], xb, builder.load(acc)]), acc)
            for t in range(tokens):
                for g in range(groups):
                    at = builder.gep(res_p, [ir.Constant(ir.IntType(64), t * lanes + _LANES * g)])
                    builder.store(
                        builder.load(accs[t * groups + g]), builder.bitcast(at, _V16F.as_pointer()), align=4
                    )
            return context.get_dummy_value()

        return sig, codegen

    return run


_h1, _h2, _h4 = _pass(TILE_ROWS, 1, True), _pass(TILE_ROWS, 2, True), _pass(TILE_ROWS // 2, _BLOCK, True)
_f1, _f2, _f4 = _pass(TILE_ROWS, 1, False), _pass(TILE_ROWS, 2, False), _pass(TILE_ROWS // 2, _BLOCK, False)


@numba.njit(cache=True, nogil=True, inline="always")
def _put(out, res, t, tokens, lanes, r0, m):  # pragma: no cover - numba
    """A pass's results (``res[b * lanes + k]``) into ``out[t + b, r0 + k]``, for the first ``m`` of its
    ``lanes`` rows (the last tile's padding rows are dropped; m <= 0: none)."""
    for b in range(tokens):
        for k in range(max(0, min(lanes, m))):
            out[t + b, r0 + k] = res[b * lanes + k]


@numba.njit(cache=True, nogil=True, inline="always")
def _run(res, half, b, wg, roff, xf, xoff, cols):  # pragma: no cover - numba
    """One pass of b tokens (4: against half a tile; 2, 1: a whole tile) over fp16 or f32 tiles."""
    if half:
        if b == _BLOCK:
            _h4(res, wg, roff, xf, xoff, cols)
        elif b == 2:
            _h2(res, wg, roff, xf, xoff, cols)
        else:
            _h1(res, wg, roff, xf, xoff, cols)
    elif b == _BLOCK:
        _f4(res, wg, roff, xf, xoff, cols)
    elif b == 2:
        _f2(res, wg, roff, xf, xoff, cols)
    else:
        _f1(res, wg, roff, xf, xoff, cols)


@numba.njit(cache=True, nogil=True, parallel=True)
def mm_fast(out, w, x, n, rows, cols, half):  # pragma: no cover - numba
    """out[n, rows] = x[n, cols] @ W.T for W in tiles of fp16 bits (``half``: ``halves.pack_f16``) or f32
    (``floats.pack``: F32, BF16 widened), x already rounded to the weights' type; f32 sums."""
    G = w.shape[0]
    xf = np.empty(n * cols, np.float32)
    for t in range(n):
        for i in range(cols):
            xf[t * cols + i] = x[t, i]
    half_tile = TILE_ROWS // 2
    for c in prange(N_CHUNKS):
        res = np.empty(_BLOCK * TILE_ROWS, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            wg = w[g]
            r0 = g * TILE_ROWS
            m = min(TILE_ROWS, rows - r0)
            t = 0
            while t + _BLOCK <= n:
                for h in range(2):
                    _run(res, half, _BLOCK, wg, h * half_tile, xf, t * cols, cols)
                    _put(out, res, t, _BLOCK, half_tile, r0 + h * half_tile, m - h * half_tile)
                t += _BLOCK
            while t + 2 <= n:
                _run(res, half, 2, wg, 0, xf, t * cols, cols)
                _put(out, res, t, 2, TILE_ROWS, r0, m)
                t += 2
            while t < n:
                _run(res, half, 1, wg, 0, xf, t * cols, cols)
                _put(out, res, t, 1, TILE_ROWS, r0, m)
                t += 1
