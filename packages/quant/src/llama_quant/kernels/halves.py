"""F16 weights kept in fp16, their products accumulated in registers: the AVX2 and AVX-512 sets' F16 kernel.

The numbers are ``floats.mv_float``'s (ggml's scalar ``ggml_vec_dot_f16``): for each output, the products
of the fp16 weight and the fp16-rounded activation added in index order to an f64 sum that starts at 0,
the sum rounded to f32. Two fp16 values have 11-bit significands and exponents well inside f32's and f64's
ranges, so their product is exact in f32 (22 bits) and equally exact in f64. A fused multiply-add in f64
rounds ``sum + w * x`` once, and with an exact product that is the very f64 addition ggml makes of its
widened f32 product: the same additions in the same order (hence the AVX2 set's need of FMA).

What changes is the work around them. The weights stay fp16 in the tiles (``_tiles``: element i of row r at
``i * 64 + r``), half the bytes of f32 tiles, widened as they are read; the f64 sums of a pass live in
registers for the whole row (an intrinsic whose loop over the columns carries its accumulators, which
numba's loops over a heap array cannot); and a pass takes four tokens against half a tile (or two against
a whole one), so a verified draft or a prompt reads each weight once for several tokens.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import float64, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._tiles import N_CHUNKS, TILE_ROWS, row_minor, tile_rows

__all__ = ["lane_pass", "mm_f16", "pack_f16"]

_F64 = ir.DoubleType()
_BLOCK = 4  # tokens of a pass against half a tile (what is left: two, then one, against a whole tile)


def pack_f16(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, ...]:
    """Raw F16 rows [rows, row_bytes] uint8 -> (w [G, cols * 64] uint16: fp16 bits, row-minor tiles,)."""
    w = np.ascontiguousarray(raw).reshape(-1).view(np.uint16).reshape(rows, cols)
    return (row_minor(tile_rows(w, rows)),)


def _muladd(builder, name: str, vec: ir.VectorType):  # type: ignore[no-untyped-def]
    """An LLVM multiply-add of vectors: ``llvm.fma`` is always rounded once (one ``vfmadd`` with FMA),
    ``llvm.fmuladd`` fuses where the target can."""
    module = builder.module
    full = f"{name}.v{vec.count}{'f64' if vec.element == _F64 else 'f32'}"
    return module.globals.get(full) or ir.Function(module, ir.FunctionType(vec, [vec] * 3), full)


def lane_pass(lanes: int, tokens: int, width: int, acc: ir.Type, weight: ir.Type, muladd: str):  # type: ignore[no-untyped-def]
    """An intrinsic ``(res, w, roff, x, xoff, cols)``: for ``tokens`` tokens (x in the sums' type ``acc``,
    token t's values at ``x[xoff + t * cols:]``) and the ``lanes`` rows of the tile ``w`` (elements of type
    ``weight``, widened to ``acc``) from row ``roff``, the sums over the ``cols`` columns in index order,
    ``width`` rows to a vector, each step one ``muladd`` ("llvm.fma" or "llvm.fmuladd"), stored as f32 into
    ``res[t * lanes + r]``."""
    groups = lanes // width
    vacc, vw, vf = (
        ir.VectorType(acc, width),
        ir.VectorType(weight, width),
        ir.VectorType(ir.FloatType(), width),
    )
    align = 2 if isinstance(weight, ir.HalfType) else 4

    @intrinsic
    def run(typingctx, res, w, roff, x, xoff, cols):  # type: ignore[no-untyped-def]
        sig = types.void(res, w, types.intp, x, types.intp, types.intp)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            arrays = [context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 1, 3)]
            res_p, w_p, x_p = (a.data for a in arrays)
            roff, xoff, cols = args[2], args[4], args[5]
            zero = ir.Constant(vacc, [0.0] * width)
            accs = [cgutils.alloca_once_value(builder, zero) for _ in range(tokens * groups)]
            lane0 = ir.Constant(ir.IntType(32), 0)
            spread = ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width)
            fn = _muladd(builder, muladd, vacc)
            with cgutils.for_range(builder, cols) as loop:
                i = loop.index
                base = builder.add(builder.mul(i, ir.Constant(i.type, TILE_ROWS)), roff)
                ws = []
                for g in range(groups):
                    at = builder.gep(w_p, [builder.add(base, ir.Constant(i.type, width * g))])
                    v = builder.load(builder.bitcast(at, vw.as_pointer()), align=align)
                    ws.append(v if weight == acc else builder.fpext(v, vacc))
                for t in range(tokens):
                    xo = builder.add(builder.add(xoff, i), builder.mul(cols, ir.Constant(i.type, t)))
                    xi = builder.load(builder.gep(x_p, [xo]))
                    one = builder.insert_element(ir.Constant(vacc, ir.Undefined), xi, lane0)
                    xb = builder.shuffle_vector(one, ir.Constant(vacc, ir.Undefined), spread)
                    for g in range(groups):
                        a = accs[t * groups + g]
                        builder.store(builder.call(fn, [ws[g], xb, builder.load(a)]), a)
            for t in range(tokens):
                for g in range(groups):
                    at = builder.gep(res_p, [ir.Constant(ir.IntType(64), t * lanes + width * g)])
                    val = builder.load(accs[t * groups + g])
                    val = val if acc == ir.FloatType() else builder.fptrunc(val, vf)
                    builder.store(val, builder.bitcast(at, vf.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return run


def _pass(lanes: int, tokens: int):  # type: ignore[no-untyped-def]
    """f64 sums of fp16 weights, 8 rows to a vector, each step a fused multiply-add: the product is exact
    (module doc), so adding it is ggml's addition of its widened f32 product; rounded to f32 at the end."""
    return lane_pass(lanes, tokens, 8, _F64, ir.HalfType(), "llvm.fma")


_tile1 = _pass(TILE_ROWS, 1)
_tile2 = _pass(TILE_ROWS, 2)
_half4 = _pass(TILE_ROWS // 2, _BLOCK)


@numba.njit(cache=True, nogil=True, inline="always")
def _put(out, res, t, tokens, lanes, r0, m):  # pragma: no cover - numba
    """A pass's results (``res[b * lanes + k]``) into ``out[t + b, r0 + k]``, for the first ``m`` of its
    ``lanes`` rows (the last tile's padding rows are dropped; m <= 0: none)."""
    for b in range(tokens):
        for k in range(max(0, min(lanes, m))):
            out[t + b, r0 + k] = res[b * lanes + k]


@numba.njit(cache=True, nogil=True, parallel=True)
def mm_f16(out, w, x, n, rows, cols):  # pragma: no cover - numba
    """out[n, rows] = x[n, cols] @ W.T for W in fp16 tiles (``pack_f16``), x already rounded to fp16."""
    G = w.shape[0]
    x64 = np.empty(n * cols, np.float64)
    for t in range(n):
        for i in range(cols):
            x64[t * cols + i] = float64(x[t, i])
    half = TILE_ROWS // 2
    for c in prange(N_CHUNKS):
        res = np.empty(_BLOCK * TILE_ROWS, np.float32)
        for g in range(G * c // N_CHUNKS, G * (c + 1) // N_CHUNKS):
            wg = w[g]
            r0 = g * TILE_ROWS
            m = min(TILE_ROWS, rows - r0)
            t = 0
            while t + _BLOCK <= n:
                for h in range(2):
                    _half4(res, wg, h * half, x64, t * cols, cols)
                    _put(out, res, t, _BLOCK, half, r0 + h * half, m - h * half)
                t += _BLOCK
            while t + 2 <= n:
                _tile2(res, wg, 0, x64, t * cols, cols)
                _put(out, res, t, 2, TILE_ROWS, r0, m)
                t += 2
            while t < n:
                _tile1(res, wg, 0, x64, t * cols, cols)
                _put(out, res, t, 1, TILE_ROWS, r0, m)
                t += 1
