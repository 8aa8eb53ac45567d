"""Plain-numpy references of the exact kernels, for tests: same signatures, straight from the raw ggml bytes.

The activation quantizers mirror ``act``; ``matmul`` mirrors ``ExactMatrix.matmul`` from the raw weight
bytes (no repacking): it decodes every block to integers, forms ggml's integer sums with int64 einsums and
then runs the generic vec_dot's float steps block after block in f32 numpy (one ufunc per C operation, so
each is rounded to f32 exactly as in C; numpy never fuses them).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from . import ref_iquants

__all__ = [
    "decode",
    "matmul",
    "matvec",
    "quantize_bf16",
    "quantize_f16",
    "quantize_q8",
    "quantize_q8_k",
    "vec_dot_type",
]

f32 = np.float32

# ggml-cpu.c type_traits_cpu[...].vec_dot_type
_VEC_DOT_TYPE = {
    T.Q4_0: T.Q8_0,
    T.Q5_0: T.Q8_0,
    T.Q8_0: T.Q8_0,
    T.Q4_1: T.Q8_1,
    T.Q5_1: T.Q8_1,
    T.Q2_K: T.Q8_K,
    T.Q3_K: T.Q8_K,
    T.Q4_K: T.Q8_K,
    T.Q5_K: T.Q8_K,
    T.Q6_K: T.Q8_K,
    T.F16: T.F16,
    T.BF16: T.BF16,
    T.F32: T.F32,
    T.IQ4_NL: T.Q8_0,
    T.MXFP4: T.Q8_0,
    **dict.fromkeys(
        (T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S),
        T.Q8_K,
    ),
}
_BLOCK = {
    T.Q4_0: (32, 18),
    T.Q4_1: (32, 20),
    T.Q5_0: (32, 22),
    T.Q5_1: (32, 24),
    T.Q8_0: (32, 34),
    T.Q2_K: (256, 84),
    T.Q3_K: (256, 110),
    T.Q4_K: (256, 144),
    T.Q5_K: (256, 176),
    T.Q6_K: (256, 210),
    **ref_iquants.BLOCKS,
}


def vec_dot_type(qtype: T | int) -> T:
    """The type ggml quantizes activations to before a product with weights of ``qtype``."""
    return _VEC_DOT_TYPE[T(qtype)]


# --- activations ---------------------------------------------------------------------------------------


def _roundf_i8(v: np.ndarray) -> np.ndarray:
    """(int8_t)roundf(v): half away from zero; inf/nan -> 0 (x86's INT_MIN low byte)."""
    with np.errstate(invalid="ignore"):
        ok = np.abs(v.astype(np.float64)) < 2.0**31
        a = np.where(ok, v, 0).astype(np.float64)
    t = np.trunc(a)
    t = t + np.where(a - t >= 0.5, 1.0, 0.0) - np.where(a - t <= -0.5, 1.0, 0.0)
    return t.astype(np.int64).astype(np.int8)


def quantize_q8(xq, xd, xs, xsum16, x, n, cols) -> None:
    """Reference of ``act.quantize_q8`` (Q8_0 and Q8_1 at once)."""
    xb = x[:n].reshape(n, cols // 32, 32)
    amax = np.max(np.abs(xb), axis=2)
    d = (amax / f32(127.0)).astype(f32)
    with np.errstate(divide="ignore", over="ignore"):
        iv = np.where(d != 0, f32(1.0) / d, f32(0.0)).astype(f32)
    with np.errstate(invalid="ignore", over="ignore"):
        q = _roundf_i8((xb * iv[:, :, None]).astype(f32))
    xq[:n] = q.reshape(n, cols)
    s16 = q.reshape(n, cols // 16, 16).astype(np.int32).sum(axis=2)
    xsum16[:n] = s16
    s = s16.reshape(n, -1, 2).sum(axis=2)
    with np.errstate(over="ignore"):
        xd[:n] = d.astype(np.float16).astype(f32)
        xs[:n] = (s.astype(f32) * d).astype(np.float16).astype(f32)


def quantize_q8_k(xq, xd, xsum16, x, n, cols) -> None:
    """Reference of ``act.quantize_q8_k``."""
    xb = x[:n].reshape(n, cols // 256, 256)
    ax = np.abs(xb)
    i = np.argmax(ax, axis=2)  # first index of the largest |x|: ggml's strict '>' scan
    mx = np.take_along_axis(xb, i[..., None], axis=2)[..., 0]
    zero = np.max(ax, axis=2) == 0
    with np.errstate(divide="ignore", over="ignore"):
        iscale = np.where(zero, f32(0.0), f32(-127.0) / np.where(zero, f32(1.0), mx)).astype(f32)
        d = np.where(zero, f32(0.0), f32(1.0) / np.where(zero, f32(1.0), iscale)).astype(f32)
    with np.errstate(invalid="ignore", over="ignore"):
        v = ((xb * iscale[..., None]).astype(f32) + f32(12582912.0)).astype(f32)  # ggml's nearest_int
    q = np.minimum((v.view(np.uint32) & 0x7FFFFF).astype(np.int64) - 0x400000, 127).astype(np.int8)
    xq[:n] = q.reshape(n, cols)
    xd[:n] = d
    xsum16[:n] = q.reshape(n, cols // 16, 16).astype(np.int32).sum(axis=2)


def quantize_f16(xh, x, n, cols) -> None:
    """Reference of ``act.quantize_f16``."""
    with np.errstate(over="ignore"):
        xh[:n] = x[:n].astype(np.float16).astype(f32)


def quantize_bf16(xh, x, n, cols) -> None:
    """Reference of ``act.quantize_bf16``."""
    u = np.ascontiguousarray(x[:n], dtype=f32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = np.where(nan, (u | 0x00400000) >> 16, (u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF
    xh[:n] = (r.astype(np.uint32) << 16).view(f32)


# --- weights -------------------------------------------------------------------------------------------


def _f16(b: np.ndarray, o: int) -> np.ndarray:
    return b[..., o : o + 2].copy().view(np.float16)[..., 0].astype(f32)


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = s.astype(np.int64)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    return sc, mn


def _q3_scales(s: np.ndarray) -> np.ndarray:
    a = s.astype(np.int64)
    lo = np.concatenate([a[..., 0:8] & 0xF, a[..., 0:8] >> 4], axis=-1)  # 16 low nibbles
    hi = np.stack([(a[..., 8 + (j % 4)] >> (2 * (j // 4))) & 3 for j in range(16)], axis=-1)
    return (lo | (hi << 4)) - 32


def decode(raw: np.ndarray, qtype: T | int, rows: int, cols: int) -> dict[str, np.ndarray]:
    """The integers and scales ggml's vec_dot uses, per block: ``q`` int64 [rows, nb, block] (the values the
    integer sums multiply), ``d`` (and ``m`` / ``dmin``) f32 [rows, nb]; K types also ``sc`` (the integer
    scale of each 16 values) and ``mn`` (the min of each 16 values) int64 [rows, nb, 16]."""
    qtype = T(qtype)
    if qtype in ref_iquants.BLOCKS:
        return ref_iquants.decode(raw, qtype, rows, cols)
    block, nbytes = _BLOCK[qtype]
    b = np.asarray(raw).reshape(-1).view(np.uint8).reshape(rows, cols // block, nbytes)
    i64 = np.int64
    if qtype == T.Q8_0:
        return {"d": _f16(b, 0), "q": b[..., 2:34].view(np.int8).astype(i64)}
    if qtype in (T.Q4_0, T.Q4_1):
        qs = b[..., 2:18] if qtype == T.Q4_0 else b[..., 4:20]
        q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(i64)
        if qtype == T.Q4_0:
            return {"d": _f16(b, 0), "q": q - 8}
        return {"d": _f16(b, 0), "m": _f16(b, 2), "q": q}
    if qtype in (T.Q5_0, T.Q5_1):
        o = 2 if qtype == T.Q5_0 else 4
        qh = b[..., o : o + 4].copy().view("<u4")[..., 0].astype(i64)
        qs = b[..., o + 4 : o + 20].astype(i64)
        bits = (qh[..., None] >> np.arange(32)) & 1
        q = np.concatenate([qs & 15, qs >> 4], axis=-1) | (bits << 4)
        if qtype == T.Q5_0:
            return {"d": _f16(b, 0), "q": q - 16}
        return {"d": _f16(b, 0), "m": _f16(b, 2), "q": q}
    if qtype == T.Q2_K:
        q2 = b[..., 16:80].astype(i64).reshape(rows, -1, 2, 1, 32)
        q = (q2 >> (2 * np.arange(4))[:, None]) & 3  # [rows, nb, chunk, shift, 32]
        s = b[..., 0:16].astype(i64)
        return {
            "d": _f16(b, 80),
            "dmin": _f16(b, 82),
            "q": q.reshape(rows, -1, 256),
            "sc": s & 15,
            "mn": s >> 4,
        }
    if qtype == T.Q3_K:
        hm = b[..., 0:32].astype(i64)
        q3 = b[..., 32:96].astype(i64).reshape(rows, -1, 2, 1, 32)
        q = (q3 >> (2 * np.arange(4))[:, None]) & 3
        shift = (4 * np.arange(2))[:, None] + np.arange(4)  # [chunk, shift] -> hmask bit
        h = (hm[:, :, None, None, :] >> shift[..., None]) & 1
        q = q - 4 * (1 - h)
        return {"d": _f16(b, 108), "q": q.reshape(rows, -1, 256), "sc": _q3_scales(b[..., 96:108])}
    if qtype in (T.Q4_K, T.Q5_K):
        o = 16 if qtype == T.Q4_K else 48
        q4 = b[..., o : o + 128].astype(i64).reshape(rows, -1, 4, 1, 32)
        q = (q4 >> (4 * np.arange(2))[:, None]) & 15  # [rows, nb, chunk, half, 32]
        if qtype == T.Q5_K:
            qh = b[..., 16:48].astype(i64)
            sh = (2 * np.arange(4))[:, None] + np.arange(2)
            q = q + 16 * ((qh[:, :, None, None, :] >> sh[..., None]) & 1)
        sc, mn = _scale_min_k4(b[..., 4:16])
        return {
            "d": _f16(b, 0),
            "dmin": _f16(b, 2),
            "q": q.reshape(rows, -1, 256),
            "sc": np.repeat(sc, 2, axis=-1),
            "mn": np.repeat(mn, 2, axis=-1),
        }
    if qtype == T.Q6_K:
        ql = b[..., 0:128].astype(i64).reshape(rows, -1, 2, 64)
        qh = b[..., 128:192].astype(i64).reshape(rows, -1, 2, 32)
        lo = np.stack([ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=-2)
        hi = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=-2)
        q = (lo | (hi << 4)) - 32  # [rows, nb, half, 4, 32]
        return {
            "d": _f16(b, 208),
            "q": q.reshape(rows, -1, 256),
            "sc": b[..., 192:208].view(np.int8).astype(i64),
        }
    raise ValueError(f"no exact kernel for {qtype.name}")


def _acts(qtype: T, x: np.ndarray, n: int, cols: int) -> dict[str, np.ndarray]:
    vt = vec_dot_type(qtype)
    if vt in (T.Q8_0, T.Q8_1):
        xq = np.zeros((n, cols), np.int8)
        xd, xs = np.zeros((n, cols // 32), f32), np.zeros((n, cols // 32), f32)
        xsum = np.zeros((n, cols // 16), np.int32)
        quantize_q8(xq, xd, xs, xsum, x, n, cols)
        return {"q": xq.astype(np.int64).reshape(n, -1, 32), "d": xd, "s": xs}
    if vt == T.Q8_K:
        xq = np.zeros((n, cols), np.int8)
        xd, xsum = np.zeros((n, cols // 256), f32), np.zeros((n, cols // 16), np.int32)
        quantize_q8_k(xq, xd, xsum, x, n, cols)
        return {"q": xq.astype(np.int64).reshape(n, -1, 256), "d": xd, "bsums": xsum.reshape(n, -1, 16)}
    xh = np.zeros((n, cols), f32)
    if vt == T.F16:
        quantize_f16(xh, x, n, cols)
    elif vt == T.BF16:
        quantize_bf16(xh, x, n, cols)
    else:
        xh[:] = x[:n]
    return {"x": xh}


def _weights_f(raw: np.ndarray, qtype: T, rows: int, cols: int) -> np.ndarray:
    if qtype == T.F32:
        return np.asarray(raw).reshape(-1).view(f32).reshape(rows, cols)
    w = np.asarray(raw).reshape(-1).view(np.uint16).reshape(rows, cols)
    if qtype == T.F16:
        return w.view(np.float16).astype(f32)
    return (w.astype(np.uint32) << 16).view(f32)


def matmul(out: np.ndarray, raw: np.ndarray, qtype: T | int, rows: int, cols: int, x: np.ndarray) -> None:
    """out[n, rows] = X[n, cols] @ W.T as ggml's generic CPU kernels compute it, W raw ggml bytes."""
    qtype = T(qtype)
    n = x.shape[0]
    a = _acts(qtype, np.ascontiguousarray(x, dtype=f32), n, cols)
    if "x" in a:  # F16 / BF16 / F32: f32 products summed in f64, in index order
        w = _weights_f(raw, qtype, rows, cols)
        acc = np.zeros((n, rows), np.float64)
        for i in range(cols):
            acc += (a["x"][:, i, None] * w[None, :, i]).astype(np.float64)
        out[:] = acc.astype(f32)
        return
    wd = decode(raw, qtype, rows, cols)
    q, d = wd["q"], wd["d"]
    sumf = np.zeros((n, rows), f32)
    if q.shape[-1] == 32:
        sumi = np.einsum("tbj,rbj->trb", a["q"], q).astype(f32)
        for b in range(cols // 32):
            dy = a["d"][:, b, None]
            dw = d[None, :, b]
            s = sumi[:, :, b]
            if qtype == T.Q4_0:
                sumf = sumf + (s * dw) * dy
            elif qtype == T.Q5_0:
                sumf = sumf + (dw * dy) * s
            elif qtype == T.Q8_0:
                sumf = sumf + s * (dw * dy)
            elif qtype in (T.IQ4_NL, T.MXFP4):
                sumf = sumf + (dy * dw) * s
            else:  # Q4_1, Q5_1
                sumf = sumf + ((dw * dy) * s + wd["m"][None, :, b] * a["s"][:, b, None])
        out[:] = sumf
        return
    if qtype in ref_iquants.BLOCKS:
        out[:] = ref_iquants.matmul_k(qtype, wd, a["q"], a["d"])
        return
    # K types: ggml's 8 lanes aux32[l] = sum over positions p = l (mod 8) of scale(p // 16) * q8[p] * a[p]
    nb = cols // 256
    scq = (q.reshape(rows, nb, 16, 16) * wd["sc"][..., None]).reshape(rows, nb, 32, 8)
    lanes = np.einsum("tsml,rsml->trsl", a["q"].reshape(n, nb, 32, 8), scq)
    sums = np.zeros((n, rows, 8), f32)
    for s in range(nb):
        dy = a["d"][:, s, None]
        if qtype == T.Q2_K:
            isum = lanes[:, :, s].sum(axis=-1).astype(f32)
            summs = np.einsum("tj,rj->tr", a["bsums"][:, s].astype(np.int64), wd["mn"][:, s]).astype(f32)
            dall = dy * d[None, :, s]
            dmin = dy * wd["dmin"][None, :, s]
            sumf = sumf + (dall * isum - dmin * summs)
            continue
        dd = d[None, :, s] * dy
        sums = sums + dd[..., None] * lanes[:, :, s].astype(f32)
        if qtype in (T.Q4_K, T.Q5_K):
            sumi = np.einsum("tj,rj->tr", a["bsums"][:, s].astype(np.int64), wd["mn"][:, s]).astype(f32)
            dmin = wd["dmin"][None, :, s] * dy
            sumf = sumf - dmin * sumi
    if qtype != T.Q2_K:
        for lane in range(8):
            sumf = sumf + sums[..., lane]
    out[:] = sumf


def matvec(out: np.ndarray, raw: np.ndarray, qtype: T | int, rows: int, cols: int, x: np.ndarray) -> None:
    """out[rows] = W @ x[cols]: ``matmul`` of one row."""
    matmul(out.reshape(1, rows), raw, qtype, rows, cols, x.reshape(1, cols))
