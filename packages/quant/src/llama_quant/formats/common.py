# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""Numba helpers shared by the block formats: bit casts, fp16, rounding and the scale searches of
ggml-quants.c (make_qx_quants, make_q3_quants, make_qkx2/3_quants as make_qkx_lanes, make_qp_quants).

Everything here computes in float32 exactly as the C code does: every intermediate is a float32
(numba widens float32 * int or float32 * Python float to float64, so integers and constants are cast
with ``_f`` first), and every sum accumulates in the C loop's order. There is no fused multiply-add:
LLVM only contracts ``a * b + c`` under fast-math, which these kernels never enable, and ggml-base is
built without it as well. ``error_model="numpy"`` gives C's IEEE division by zero instead of an
exception.

Where the C code runs independent searches one after another (candidate scales of one group, or the
groups of a row), the kernels advance them side by side -- each still performs exactly the scalar
sequence of operations -- so that the loops vectorize; that is where they gain over the C code.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = [
    "F16_TO_F32",
    "absmax_signed",
    "f16_to_f32",
    "f32_bits",
    "f32_from_bits",
    "f32_to_f16",
    "get_f16",
    "lroundf",
    "make_q3_quants",
    "make_qkx_lanes",
    "make_qp_quants",
    "make_qx_quants",
    "nearest_int",
    "put_f16",
    "qkx_groups",
    "roundf",
    "sum_sq",
    "transpose",
]

_f = np.float32
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23, nearest_int's rounding constant
_GROUP_MAX_EPS = np.float32(1e-15)
_SCALE_TO_INF = np.float32(2.0**112)
_SCALE_TO_ZERO = np.float32(2.0**-110)

# fp16 -> fp32 for every bit pattern, by numpy's own conversion, so dequantized values (NaN
# payloads included) equal gguf-py's ``view(np.float16).astype(np.float32)``.
F16_TO_F32: np.ndarray = (
    np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
)


@intrinsic
def f32_bits(typingctx, x):
    """Reinterpret a float32 as its uint32 bit pattern (C's memcpy / union trick)."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def f32_from_bits(typingctx, u):
    """Reinterpret a uint32 bit pattern as a float32."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@njit(cache=True, inline="always", error_model="numpy")
def f16_to_f32(h):
    """fp16 bits -> float32 (exact; GGML_FP16_TO_FP32)."""
    return F16_TO_F32[h & 0xFFFF]


@njit(cache=True, inline="always", error_model="numpy")
def f32_to_f16(f):
    """float32 -> fp16 bits, round to nearest even: ggml_compute_fp32_to_fp16 in ggml-impl.h."""
    base = (abs(f) * _SCALE_TO_INF) * _SCALE_TO_ZERO
    w = f32_bits(f)
    shl1_w = np.uint32(w + w)
    sign = w & np.uint32(0x80000000)
    bias = shl1_w & np.uint32(0xFF000000)
    if bias < np.uint32(0x71000000):
        bias = np.uint32(0x71000000)
    base = f32_from_bits(np.uint32((bias >> np.uint32(1)) + np.uint32(0x07800000))) + base
    bits = f32_bits(base)
    exp_bits = (bits >> np.uint32(13)) & np.uint32(0x00007C00)
    mantissa_bits = bits & np.uint32(0x00000FFF)
    nonsign = exp_bits + mantissa_bits
    if shl1_w > np.uint32(0xFF000000):
        nonsign = np.uint32(0x7E00)
    return np.uint16((sign >> np.uint32(16)) | nonsign)


@njit(cache=True, inline="always", error_model="numpy")
def put_f16(out, pos, f):
    """Store f as little-endian fp16 at out[pos : pos + 2]; returns the stored value as float32."""
    h = np.int64(f32_to_f16(f))
    out[pos] = h & 0xFF
    out[pos + 1] = h >> 8
    return F16_TO_F32[h]


@njit(cache=True, inline="always", error_model="numpy")
def get_f16(raw, pos):
    """The little-endian fp16 at raw[pos : pos + 2] as float32."""
    return F16_TO_F32[np.int64(raw[pos]) | (np.int64(raw[pos + 1]) << 8)]


@njit(cache=True, inline="always", error_model="numpy")
def sum_sq(x):
    """sum(x[j] * x[j]) in float32, in order (the C loops that start sigma2)."""
    s = _ZERO
    for j in range(x.size):
        s += x[j] * x[j]
    return s


@njit(cache=True, inline="always", error_model="numpy")
def absmax_signed(x, n):
    """(max |x[i]|, the x[i] that has it) over x[:n], the first one on ties; NaNs are passed over."""
    amax = _ZERO
    vmax = _ZERO
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            vmax = x[i]
    return amax, vmax


@njit(cache=True, inline="always", error_model="numpy")
def nearest_int(fval):
    """Round a float32 to the nearest int, ties to even, by ggml's 1.5*2**23 bit trick (exact C semantics,
    including the garbage it returns outside |fval| < 2**22)."""
    val = fval + _MAGIC
    return np.int64(f32_bits(val) & np.uint32(0x007FFFFF)) - 0x00400000


@njit(cache=True, inline="always", error_model="numpy")
def roundf(v):
    """C roundf: round half away from zero, float32 in and out."""
    t = np.trunc(v)
    if abs(v - t) >= _HALF:
        t = t + (_ONE if v > _ZERO else -_ONE)
    return _f(t)


@njit(cache=True, inline="always", error_model="numpy")
def lroundf(v):
    """C lroundf: round half away from zero to an integer; NaN and out-of-range give LONG_MIN as on x86-64."""
    if not abs(v) < _f(9.2e18):
        return np.int64(-9223372036854775807 - 1)
    return np.int64(roundf(v))


@njit(cache=True, error_model="numpy")
def make_qx_quants(n, nmax, x, L, qw, use_qw, st):
    """Symmetric search (rmse_type 1) writing L[i] in [0, 2*nmax); returns the scale.

    Weights are qw[i] when use_qw else x[i]**2. ggml-quants.c: make_qx_quants. The 19 candidate scales
    (the first guess and -9..9 tenths) are independent, so their sums are accumulated side by side, each
    in the C order; the sequential choice among them is then the C loop's. st: float32[3, 19] scratch.
    """
    amax, fmax = absmax_signed(x, n)
    if amax < _GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _ZERO
    isc = st[0]
    sumlx = st[1]
    suml2 = st[2]
    isc[0] = _f(-nmax) / fmax
    for t in range(1, 19):
        step = t - 10 if t < 10 else t - 9  # -9..-1, 1..9
        isc[t] = -(_f(nmax) + _f(0.1) * _f(step)) / fmax
    for t in range(19):
        sumlx[t] = _ZERO
        suml2[t] = _ZERO
    for i in range(n):
        xi = x[i]
        w = qw[i] if use_qw else xi * xi
        wx = w * xi
        for t in range(19):
            fl = _f(max(-nmax, min(nmax - 1, nearest_int(isc[t] * xi))))
            sumlx[t] += wx * fl
            suml2[t] += w * fl * fl
    scale = sumlx[0] / suml2[0] if suml2[0] != _ZERO else _ZERO
    best = scale * sumlx[0]
    chosen = 0
    for t in range(1, 19):
        if suml2[t] > _ZERO and sumlx[t] * sumlx[t] > best * suml2[t]:
            scale = sumlx[t] / suml2[t]
            best = scale * sumlx[t]
            chosen = t
    for i in range(n):
        L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(isc[chosen] * x[i])))
    return scale


@njit(cache=True, error_model="numpy")
def make_q3_quants(n, nmax, x, L):
    """Q3_K's reference search with do_rmse=true; L[i] in [0, 2*nmax). ggml: make_q3_quants."""
    amax, fmax = absmax_signed(x, n)
    if amax < _GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _ZERO
    iscale = _f(-nmax) / fmax
    sumlx = _ZERO
    suml2 = _ZERO
    for i in range(n):
        li = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
        L[i] = li
        w = x[i] * x[i]
        fl = _f(li)
        sumlx += w * x[i] * fl
        suml2 += w * fl * fl
    for _itry in range(5):
        n_changed = 0
        for i in range(n):
            w = x[i] * x[i]
            fli = _f(L[i])
            slx = sumlx - w * x[i] * fli
            if slx > _ZERO:
                sl2 = suml2 - w * fli * fli
                new_l = max(-nmax, min(nmax - 1, nearest_int(x[i] * sl2 / slx)))
                if new_l != L[i]:
                    fnl = _f(new_l)
                    slx += w * x[i] * fnl
                    sl2 += w * fnl * fnl
                    if sl2 > _ZERO and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > _ZERO else _ZERO


@njit(cache=True, error_model="numpy")
def make_qp_quants(n, nmax, x, L, quant_weights):
    """Non-negative search for the 6-bit/4-bit super-block scales; L[i] in [0, nmax]. ggml: make_qp_quants."""
    fmax = _ZERO
    for i in range(n):
        fmax = fmax if fmax > x[i] else x[i]
    if fmax < _GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _ZERO
    iscale = _f(nmax) / fmax
    for i in range(n):
        L[i] = nearest_int(iscale * x[i]) & 0xFF
    scale = _ONE / iscale
    best_mse = _ZERO
    for i in range(n):
        diff = x[i] - scale * _f(L[i])
        best_mse += quant_weights[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (_f(0.1) * _f(step) + _f(nmax)) / fmax
        scale_is = _ONE / iscale_is
        mse = _ZERO
        for i in range(n):
            li = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * _f(li)
            mse += quant_weights[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = _ZERO
    suml2 = _ZERO
    for i in range(n):
        li = min(nmax, nearest_int(iscale * x[i]))
        L[i] = li & 0xFF
        w = quant_weights[i]
        fl = _f(li)  # the int, not the stored byte (they differ for the negative x of IQ2_XXS's sign groups)
        sumlx += w * x[i] * fl
        suml2 += w * fl * fl
    for _itry in range(5):
        n_changed = 0
        for i in range(n):
            w = quant_weights[i]
            fli = _f(L[i])
            slx = sumlx - w * x[i] * fli
            sl2 = suml2 - w * fli * fli
            if slx > _ZERO and sl2 > _ZERO:
                new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    fnl = _f(new_l)
                    slx += w * x[i] * fnl
                    sl2 += w * fnl * fnl
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > _ZERO else _ZERO


@njit(cache=True, error_model="numpy")
def make_qkx_lanes(nl, n, nmax, xt, wt, Lt, Lat, rmin, rdelta, nstep, use_mad, strict, scales, the_mins, st):
    """make_qkx2_quants (strict: the ``max == min`` guard) or make_qkx3_quants on nl independent groups at once.

    The groups are stored transposed, lane index fastest: value i of group j is xt[i * nl + j] (weights wt,
    output levels Lt: uint8, same layout). Each group runs exactly the scalar algorithm -- the same float32
    operations, every sum in the C order -- but the groups advance side by side, which lets the loops
    over j vectorize. Writes scales[j] and the_mins[j]. Lat: uint8[n * nl] scratch; st: float32[13, nl].
    """
    fmin = st[0]
    fmax = st[1]
    sum_w = st[2]
    sum_x = st[3]
    iscale = st[4]
    scale = st[5]
    best = st[6]
    s_l = st[7]
    s_l2 = st[8]
    s_xl = st[9]
    t_scale = st[10]
    t_min = st[11]
    degenerate = st[12]
    for j in range(nl):
        fmin[j] = xt[j]
        fmax[j] = xt[j]
        sum_w[j] = wt[j]
        sum_x[j] = sum_w[j] * xt[j]
    for i in range(1, n):
        b = i * nl
        for j in range(nl):
            v = xt[b + j]
            fmin[j] = v if v < fmin[j] else fmin[j]
            fmax[j] = v if v > fmax[j] else fmax[j]
            w = wt[b + j]
            sum_w[j] += w
            sum_x[j] += w * v
    for j in range(nl):
        if fmin[j] > _ZERO:
            fmin[j] = _ZERO
        deg = (fmax[j] == fmin[j]) if strict else (fmax[j] <= fmin[j])
        degenerate[j] = _ONE if deg else _ZERO
        iscale[j] = _f(nmax) / (fmax[j] - fmin[j])
        scale[j] = _ONE / iscale[j]
        best[j] = _ZERO
    for i in range(n):
        b = i * nl
        for j in range(nl):
            li = max(0, min(nmax, nearest_int(iscale[j] * (xt[b + j] - fmin[j]))))
            Lt[b + j] = li
            diff = scale[j] * _f(li) + fmin[j] - xt[b + j]
            diff = abs(diff) if use_mad else diff * diff
            best[j] += wt[b + j] * diff
    for step in range(nstep + 1):
        for j in range(nl):
            iscale[j] = (rmin + rdelta * _f(step) + _f(nmax)) / (fmax[j] - fmin[j])
            s_l[j] = _ZERO
            s_l2[j] = _ZERO
            s_xl[j] = _ZERO
        for i in range(n):
            b = i * nl
            for j in range(nl):
                v = xt[b + j]
                li = max(0, min(nmax, nearest_int(iscale[j] * (v - fmin[j]))))
                Lat[b + j] = li
                fl = _f(li)
                wl = wt[b + j] * fl
                s_l[j] += wl  # sum_l += w*l
                s_l2[j] += wl * fl  # sum_l2 += w*l*l
                s_xl[j] += wl * v  # sum_xl += w*l*x
        for j in range(nl):
            D = sum_w[j] * s_l2[j] - s_l[j] * s_l[j]
            this_scale = (sum_w[j] * s_xl[j] - sum_x[j] * s_l[j]) / D
            this_min = (s_l2[j] * sum_x[j] - s_l[j] * s_xl[j]) / D
            if this_min > _ZERO:
                this_min = _ZERO
                this_scale = s_xl[j] / s_l2[j]
            t_scale[j] = this_scale
            t_min[j] = this_min
            s_l[j] = D  # reused from here on: D of this step
            s_l2[j] = _ZERO  # reused: cur_error
        for i in range(n):
            b = i * nl
            for j in range(nl):
                diff = t_scale[j] * _f(Lat[b + j]) + t_min[j] - xt[b + j]
                diff = abs(diff) if use_mad else diff * diff
                s_l2[j] += wt[b + j] * diff
        for j in range(nl):
            accept = s_l[j] > _ZERO and s_l2[j] < best[j] and degenerate[j] == _ZERO
            s_xl[j] = _ONE if accept else _ZERO  # reused: accepted flag
            if accept:
                best[j] = s_l2[j]
                scale[j] = t_scale[j]
                fmin[j] = t_min[j]
        for i in range(n):
            b = i * nl
            for j in range(nl):
                if s_xl[j] != _ZERO:
                    Lt[b + j] = Lat[b + j]
    for j in range(nl):
        if degenerate[j] != _ZERO:
            # the C functions return before any search; fmin still holds the clamped minimum
            for i in range(n):
                Lt[i * nl + j] = 0
            scales[j] = _ZERO
        else:
            scales[j] = scale[j]
        the_mins[j] = -fmin[j]


@njit(cache=True, error_model="numpy")
def transpose(src, rows, cols, dst):
    """dst[c * rows + r] = src[r * cols + c] for a rows x cols matrix src (flat)."""
    # dst[c * rows + r] = src[r * cols + c]
    for r in range(rows):
        for c in range(cols):
            dst[c * rows + r] = src[r * cols + c]


@njit(cache=True, error_model="numpy")
def qkx_groups(x, weights, gs, nmax, rmin, rdelta, nstep, use_mad, strict, scales, mins, L):
    """make_qkx_lanes over every group of gs consecutive weights of x: scales/mins per group, L (uint8) per weight."""
    nl = x.size // gs
    xt = np.empty(x.size, np.float32)
    wt = np.empty(x.size, np.float32)
    Lt = np.empty(x.size, np.uint8)
    Lat = np.empty(x.size, np.uint8)
    st = np.empty((13, nl), np.float32)
    transpose(x, nl, gs, xt)
    transpose(weights, nl, gs, wt)
    make_qkx_lanes(nl, gs, nmax, xt, wt, Lt, Lat, rmin, rdelta, nstep, use_mad, strict, scales, mins, st)
    transpose(Lt, gs, nl, L)
