"""Numpy references of the Q2_K .. Q6_K kernels, vectorized over super-blocks."""

from __future__ import annotations

import numpy as np

from llama_quant.formats.ref.common import (
    f16_bits,
    f16_to_f32,
    make_q3_quants,
    make_qkx_quants,
    make_qp_quants,
    make_qx_quants,
    nearest_int,
    row_sigma2,
)

__all__ = [
    "dequantize_q2_k",
    "dequantize_q3_k",
    "dequantize_q4_k",
    "dequantize_q5_k",
    "dequantize_q6_k",
    "quantize_q2_k",
    "quantize_q3_k",
    "quantize_q4_k",
    "quantize_q5_k",
    "quantize_q6_k",
]

_f = np.float32


def _superblocks(x, qw, nrows, ncols, sigma_num):
    """x as [nb, 256]; with qw also the C weights qw * sqrtf(sigma2 + x^2), sigma2 per super-block."""
    xb = x[: nrows * ncols].reshape(-1, 256)
    if not qw.size:
        return xb, None
    qwb = np.tile(qw.reshape(-1, 256), (nrows, 1))
    sigma2 = row_sigma2(xb, sigma_num)
    return xb, (qwb * np.sqrt(sigma2[:, None] + xb * xb)).astype(np.float32)


def _seq_max(v, absolute=False):
    # running "if (s > best) best = s" over the columns; returns (best, value at best)
    best = np.zeros(v.shape[0], np.float32)
    val = np.zeros(v.shape[0], np.float32)
    for j in range(v.shape[1]):
        a = np.abs(v[:, j]) if absolute else v[:, j]
        upd = a > best
        best = np.where(upd, a, best)
        val = np.where(upd, v[:, j], val)
    return best, val


def _seq_rowsum(v):
    s = np.zeros(v.shape[0], np.float32)
    for j in range(v.shape[1]):
        s += v[:, j]
    return s


def _f16b(v):
    return f16_bits(v.astype(np.float32)).view(np.uint8).reshape(-1, 2)


def _pack_2bit(L):
    L = L.astype(np.uint8).reshape(-1, 2, 4, 32)
    return (L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)).reshape(-1, 64)


def quantize_q2_k(x, qw, nrows, ncols, out):
    xb, w = _superblocks(x, qw, nrows, ncols, 1.0)
    nb = xb.shape[0]
    xs = xb.reshape(nb * 16, 16)
    with np.errstate(all="ignore"):
        if w is None:
            s, m, L = make_qkx_quants(xs, np.abs(xs), 3, -0.5, 0.1, 15, True, strict=True)
            s, m = s.reshape(nb, 16), m.reshape(nb, 16)
            max_scale, _ = _seq_max(s)
            max_min, _ = _seq_max(m)
            q4 = _f(15)
            sc = np.where(max_scale[:, None] > 0, nearest_int((q4 / max_scale)[:, None] * s) & 0xFF, 0)
            lm = nearest_int((q4 / max_min)[:, None] * m)
            sc = np.where(max_min[:, None] > 0, (sc | (lm << 4)) & 0xFF, sc)
            d = np.where(max_scale > 0, max_scale / q4, _f(0))
            dmin = np.where(max_min > 0, max_min / q4, _f(0))
        else:
            sw = _seq_rowsum(w.reshape(nb * 16, 16)).reshape(nb, 16)
            s, m, L = make_qkx_quants(xs, w.reshape(nb * 16, 16), 3, -0.9, 0.05, 36, False, strict=False)
            d, Ls = make_qp_quants(s.reshape(nb, 16), 15, sw)
            dmin, Lm = make_qp_quants(m.reshape(nb, 16), 15, sw)
            sc = Ls.astype(np.int64) | (Lm.astype(np.int64) << 4)
        db, mb = _f16b(d), _f16b(dmin)
        dl = (f16_to_f32(db.view(np.uint16).ravel())[:, None] * (sc & 0xF).astype(np.float32)).astype(
            np.float32
        )
        ml = (f16_to_f32(mb.view(np.uint16).ravel())[:, None] * (sc >> 4).astype(np.float32)).astype(
            np.float32
        )
        x3 = xb.reshape(nb, 16, 16)
        lq = np.clip(nearest_int((x3 + ml[..., None]) / dl[..., None]), 0, 3)
        L = np.where((dl != 0)[..., None], lq, L.reshape(nb, 16, 16)).reshape(nb, 256)
    blocks = np.concatenate([sc.astype(np.uint8), _pack_2bit(L), db, mb], axis=1)
    out[: nb * 84].reshape(-1, 84)[:] = blocks


def _pack_q3_scales(Ls):
    # Ls [nb, 16] in [0, 63] -> the 12 scale bytes
    Ls = Ls.astype(np.int64)
    sc = np.zeros((Ls.shape[0], 12), np.int64)
    sc[:, :8] = (Ls[:, :8] & 0xF) | ((Ls[:, 8:] & 0xF) << 4)
    hi = Ls >> 4
    for j in range(16):
        sc[:, 8 + j % 4] |= hi[:, j] << (2 * (j // 4))
    return sc.astype(np.uint8)


def quantize_q3_k(x, qw, nrows, ncols, out):
    xb, w = _superblocks(x, qw, nrows, ncols, 2.0)
    nb = xb.shape[0]
    xs = xb.reshape(nb * 16, 16)
    with np.errstate(all="ignore"):
        if w is None:
            s, L = make_q3_quants(xs, 4)
            s = s.reshape(nb, 16)
            _, max_scale = _seq_max(s, absolute=True)
            nz = max_scale != 0
            iscale = (_f(-32) / max_scale).astype(np.float32)
            l8 = ((nearest_int(iscale[:, None] * s) + 128) & 0xFF) - 128
            Ls = np.where(nz[:, None], np.clip(l8, -32, 31) + 32, 0)
            d = np.where(nz, _f(1) / iscale, _f(0))
        else:
            sw = _seq_rowsum(w.reshape(nb * 16, 16)).reshape(nb, 16)
            s, L = make_qx_quants(xs, 4, w.reshape(nb * 16, 16))
            d, Ls = make_qx_quants(s.reshape(nb, 16), 32, sw)
        db = _f16b(d)
        dl = (f16_to_f32(db.view(np.uint16).ravel())[:, None] * (Ls.astype(np.float32) - _f(32))).astype(
            np.float32
        )
        x3 = xb.reshape(nb, 16, 16)
        lq = np.clip(nearest_int(x3 / dl[..., None]), -4, 3) + 4
        L = np.where((dl != 0)[..., None], lq, L.reshape(nb, 16, 16)).reshape(nb, 256).astype(np.int64)
    hbit = (L > 3).astype(np.uint8)
    L = np.where(L > 3, L - 4, L)
    hmask = (hbit.reshape(nb, 8, 32) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(
        axis=1, dtype=np.uint8
    )
    blocks = np.concatenate([hmask, _pack_2bit(L), _pack_q3_scales(Ls), db], axis=1)
    out[: nb * 110].reshape(-1, 110)[:] = blocks


def _pack_k4_scales(Ls, Lm):
    Ls = Ls.astype(np.int64)
    Lm = Lm.astype(np.int64)
    sc = np.zeros((Ls.shape[0], 12), np.int64)
    sc[:, 0:4] = Ls[:, :4] | ((Ls[:, 4:] >> 4) << 6)
    sc[:, 4:8] = Lm[:, :4] | ((Lm[:, 4:] >> 4) << 6)
    sc[:, 8:12] = (Ls[:, 4:] & 0xF) | ((Lm[:, 4:] & 0xF) << 4)
    return sc.astype(np.uint8)


def _quantize_q45(x, qw, nrows, ncols, nmax):
    xb, w = _superblocks(x, qw, nrows, ncols, 2.0)
    nb = xb.shape[0]
    xs = xb.reshape(nb * 8, 32)
    with np.errstate(all="ignore"):
        if w is None:
            av_x = np.sqrt(_seq_rowsum((xs * xs).astype(np.float32)) / _f(32)).astype(np.float32)
            ww = (av_x[:, None] + np.abs(xs)).astype(np.float32)
            rmin, rdelta, nstep = (-1.0, 0.1, 20) if nmax == 15 else (-0.5, 0.1, 15)
            s, m, L = make_qkx_quants(xs, ww, nmax, rmin, rdelta, nstep, False, strict=True)
            s, m = s.reshape(nb, 8), m.reshape(nb, 8)
            max_scale, _ = _seq_max(s)
            max_min, _ = _seq_max(m)
            inv_s = np.where(max_scale > 0, _f(63) / max_scale, _f(0)).astype(np.float32)
            inv_m = np.where(max_min > 0, _f(63) / max_min, _f(0)).astype(np.float32)
            Ls = np.minimum(63, nearest_int(inv_s[:, None] * s) & 0xFF)
            Lm = np.minimum(63, nearest_int(inv_m[:, None] * m) & 0xFF)
            d, dmin = max_scale / _f(63), max_min / _f(63)
        else:
            sw = _seq_rowsum(w.reshape(nb * 8, 32)).reshape(nb, 8)
            s, m, L = make_qkx_quants(xs, w.reshape(nb * 8, 32), nmax, -0.9, 0.05, 36, False, strict=False)
            d, Ls = make_qp_quants(s.reshape(nb, 8), 63, sw)
            dmin, Lm = make_qp_quants(m.reshape(nb, 8), 63, sw)
        db, mb = _f16b(d), _f16b(dmin)
        dl = (f16_to_f32(db.view(np.uint16).ravel())[:, None] * Ls.astype(np.float32)).astype(np.float32)
        ml = (f16_to_f32(mb.view(np.uint16).ravel())[:, None] * Lm.astype(np.float32)).astype(np.float32)
        x3 = xb.reshape(nb, 8, 32)
        lq = np.clip(nearest_int((x3 + ml[..., None]) / dl[..., None]), 0, nmax)
        L = np.where((dl != 0)[..., None], lq, L.reshape(nb, 8, 32)).reshape(nb, 4, 2, 32).astype(np.uint8)
    return nb, db, mb, _pack_k4_scales(Ls, Lm), L


def quantize_q4_k(x, qw, nrows, ncols, out):
    nb, db, mb, sc, L = _quantize_q45(x, qw, nrows, ncols, 15)
    qs = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(nb, 128)
    out[: nb * 144].reshape(-1, 144)[:] = np.concatenate([db, mb, sc, qs], axis=1)


def quantize_q5_k(x, qw, nrows, ncols, out):
    nb, db, mb, sc, L = _quantize_q45(x, qw, nrows, ncols, 31)
    qs = ((L[:, :, 0] & 15) | ((L[:, :, 1] & 15) << 4)).reshape(nb, 128)
    hi = (L.reshape(nb, 8, 32) >> 4) & 1
    qh = (hi << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    out[: nb * 176].reshape(-1, 176)[:] = np.concatenate([db, mb, sc, qh, qs], axis=1)


def quantize_q6_k(x, qw, nrows, ncols, out):
    xb = x[: nrows * ncols].reshape(-1, 256)
    nb = xb.shape[0]
    xs = xb.reshape(nb * 16, 16)
    w = np.tile(qw.reshape(-1, 16), (nrows, 1)) if qw.size else None
    with np.errstate(all="ignore"):
        s, L = make_qx_quants(xs, 32, w)
        s = s.reshape(nb, 16)
        max_abs, max_scale = _seq_max(s, absolute=True)
        zero = max_abs < _f(1e-15)
        iscale = (_f(-128) / max_scale).astype(np.float32)
        db = _f16b(np.where(zero, _f(0), _f(1) / iscale))
        sc8 = np.minimum(127, nearest_int(iscale[:, None] * s))
        sc8 = (((sc8 + 128) & 0xFF) - 128).astype(np.int8)
        dl = (f16_to_f32(db.view(np.uint16).ravel())[:, None] * sc8.astype(np.float32)).astype(np.float32)
        x3 = xb.reshape(nb, 16, 16)
        lq = np.clip(nearest_int(x3 / dl[..., None]), -32, 31) + 32
        L = np.where((dl != 0)[..., None], lq, L.reshape(nb, 16, 16)).reshape(nb, 2, 4, 32).astype(np.uint8)
    ql = np.concatenate(
        [(L[:, :, 0] & 15) | ((L[:, :, 2] & 15) << 4), (L[:, :, 1] & 15) | ((L[:, :, 3] & 15) << 4)], axis=2
    ).reshape(nb, 128)
    hi = L >> 4
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(nb, 64)
    blocks = np.concatenate([ql, qh, sc8.view(np.uint8), db], axis=1)
    blocks[zero] = 0
    out[: nb * 210].reshape(-1, 210)[:] = blocks


# ---- dequantize (the expressions of gguf-py's dequantize_blocks) ----


def _d(b, pos):
    return b[:, pos : pos + 2].copy().view(np.float16).astype(np.float32)


def _unpack_2bit(qs):
    # [nb, 64] -> [nb, 256]: value p = 128h + 32s + l is (qs[32h + l] >> 2s) & 3
    q = qs.reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)
    return (q & np.uint8(3)).reshape(-1, 256)


def dequantize_q2_k(raw, n, out):
    b = raw[: n // 256 * 84].reshape(-1, 84)
    sc = b[:, :16]
    dl = (_d(b, 80) * (sc & np.uint8(15)).astype(np.float32))[..., None]
    ml = (_d(b, 82) * (sc >> np.uint8(4)).astype(np.float32))[..., None]
    q = _unpack_2bit(b[:, 16:80]).reshape(-1, 16, 16).astype(np.float32)
    out[:n] = (dl * q - ml).ravel()


def _k4_scale_min(sc):
    sc = sc.astype(np.int64)
    s = np.concatenate([sc[:, 0:4] & 63, (sc[:, 8:12] & 15) | ((sc[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([sc[:, 4:8] & 63, (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)], axis=1)
    return s, m


def dequantize_q3_k(raw, n, out):
    b = raw[: n // 256 * 110].reshape(-1, 110)
    sc = b[:, 96:108].astype(np.int64)
    lo = np.concatenate([sc[:, :8] & 15, sc[:, :8] >> 4], axis=1)
    hi = (sc[:, 8:12][:, None, :] >> (2 * np.arange(4))[None, :, None]).reshape(-1, 16) & 3
    dl = (_d(b, 108) * ((lo | (hi << 4)) - 32).astype(np.float32))[..., None]
    ql = _unpack_2bit(b[:, 32:96]).astype(np.int64)
    hb = ((b[:, 0:32][:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1).reshape(-1, 256)
    q = (ql - ((hb.astype(np.int64) ^ 1) << 2)).astype(np.float32).reshape(-1, 16, 16)
    out[:n] = (dl * q).ravel()


def _dequantize_q45(b, qs, qh):
    s, m = _k4_scale_min(b[:, 4:16])
    dl = (_d(b, 0) * s.astype(np.float32))[..., None]
    ml = (_d(b, 2) * m.astype(np.float32))[..., None]
    q = (qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & np.uint8(15)
    q = q.reshape(-1, 8, 32)
    if qh is not None:
        q = q | (((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1) << 4)
    return (dl * q.astype(np.float32) - ml).ravel()


def dequantize_q4_k(raw, n, out):
    b = raw[: n // 256 * 144].reshape(-1, 144)
    out[:n] = _dequantize_q45(b, b[:, 16:144], None)


def dequantize_q5_k(raw, n, out):
    b = raw[: n // 256 * 176].reshape(-1, 176)
    out[:n] = _dequantize_q45(b, b[:, 48:176], b[:, 16:48])


def dequantize_q6_k(raw, n, out):
    b = raw[: n // 256 * 210].reshape(-1, 210)
    dl = (_d(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32))[..., None]
    ql = (b[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & np.uint8(15)
    qh = _unpack_2bit(b[:, 128:192])
    q = (ql.reshape(-1, 256).astype(np.int64) | (qh.astype(np.int64) << 4)) - 32
    out[:n] = (dl * q.astype(np.float32).reshape(-1, 16, 16)).ravel()
