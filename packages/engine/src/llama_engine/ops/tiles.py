"""Register tiles for the attention products: 8 lanes by 4 or 8 columns of sums kept in vector registers.

``tile_sums`` / ``tile_sums8``(res, roff, a, aoff, b, boff, nt, lda, bt, bc, ldr):
res[roff + c * ldr + l] += sum over t < nt, in order, of a[aoff + t * lda + l] * b[boff + t * bt + c * bc],
for 8 lanes l and 4 (or 8) columns c (res float64). With a and b float64 holding f16 values (an f16 cache),
each product is exact, so a fused multiply-add gives the same double as ggml's float product widened and
added; with float32, the product is rounded to float first and then widened, as ggml's generic vec_dot does.
Each sum is its own (lane, column)'s, so the tile's width does not change a number: it only decides how many
independent multiply-add chains are in flight. With 32 vector registers of 8 doubles (AVX-512), 8 columns
cover the FMA latency on both units; with 16 registers of 4 doubles (AVX2) an 8-lane tile already takes two
registers a column, and 4 columns fill them. The two widths are distinct intrinsics, so the kernels that use
them are compiled (and cached) once whatever the host.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["TILE_COLS", "TILE_LANES", "tile_sums", "tile_sums8"]

TILE_LANES, TILE_COLS = 8, 4


def _tile_codegen(cols: int, res, a, b):  # type: ignore[no-untyped-def]
    sig = types.void(res, types.intp, a, types.intp, b, types.intp, *([types.intp] * 5))

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        res_v, roff, a_v, aoff, b_v, boff, nt, lda, bt, bc, ldr = args
        rp, ap, bp = (
            context.make_array(signature.args[i])(context, builder, v).data
            for i, v in ((0, res_v), (2, a_v), (4, b_v))
        )
        f64 = ir.DoubleType()
        elt = ap.type.pointee
        vd, ve = ir.VectorType(f64, TILE_LANES), ir.VectorType(elt, TILE_LANES)
        undef = ir.Constant(ve, ir.Undefined)
        splat = ir.Constant(ir.VectorType(ir.IntType(32), TILE_LANES), [0] * TILE_LANES)

        def vec_at(p, off, ty):  # type: ignore[no-untyped-def]
            return builder.bitcast(builder.gep(p, [off]), ty.as_pointer())

        def times(x, c: int):  # type: ignore[no-untyped-def]
            return builder.mul(x, ir.Constant(x.type, c))

        fma = None
        if elt == f64:
            name = f"llvm.fma.v{TILE_LANES}f64"
            fma = builder.module.globals.get(name) or ir.Function(
                builder.module, ir.FunctionType(vd, [vd, vd, vd]), name
            )
        tiles = []  # (accumulator slot, its place in res); the slots become registers
        for c in range(cols):
            at = vec_at(rp, builder.add(roff, times(ldr, c)), vd)
            slot = cgutils.alloca_once(builder, vd)
            builder.store(builder.load(at, align=8), slot)
            tiles.append((slot, at))
        with cgutils.for_range(builder, nt) as loop:
            t = loop.index
            av = builder.load(vec_at(ap, builder.add(aoff, builder.mul(t, lda)), ve), align=4)
            brow = builder.add(boff, builder.mul(t, bt))
            for c, (slot, _) in enumerate(tiles):
                scalar = builder.load(builder.gep(bp, [builder.add(brow, times(bc, c))]))
                bv = builder.shuffle_vector(
                    builder.insert_element(undef, scalar, ir.Constant(ir.IntType(32), 0)), undef, splat
                )
                acc = builder.load(slot)
                if fma is not None:
                    builder.store(builder.call(fma, [av, bv, acc]), slot)
                else:
                    builder.store(builder.fadd(acc, builder.fpext(builder.fmul(av, bv), vd)), slot)
        for slot, at in tiles:
            builder.store(builder.load(slot), at, align=8)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def tile_sums(typingctx, res, roff, a, aoff, b, boff, nt, lda, bt, bc, ldr):  # type: ignore[no-untyped-def]
    """8 lanes by 4 columns (the module doc)."""
    return _tile_codegen(TILE_COLS, res, a, b)


@intrinsic
def tile_sums8(typingctx, res, roff, a, aoff, b, boff, nt, lda, bt, bc, ldr):  # type: ignore[no-untyped-def]
    """8 lanes by 8 columns (the module doc)."""
    return _tile_codegen(8, res, a, b)
