"""Numpy references of the IQ4_NL / IQ4_XS kernels."""

from __future__ import annotations

import numpy as np

from llama_quant.formats.ref.common import f16_bits, nearest_int, signed_absmax

__all__ = ["dequantize_iq4_nl", "dequantize_iq4_xs", "quantize_iq4_nl", "quantize_iq4_xs"]

_f = np.float32
_KV = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
_KVF = _KV.astype(np.float32)


def best_index(x: np.ndarray) -> np.ndarray:
    """best_index_int8(16, kvalues_iq4nl, x): nearest table entry, the upper one unless strictly nearer below."""
    x = np.asarray(x, dtype=np.float32)
    mu = np.clip(np.searchsorted(_KVF, x, side="right"), 1, 15)
    r = np.where((x - _KVF[mu - 1]) < (_KVF[mu] - x), mu - 1, mu)
    return np.where(x <= _KVF[0], 0, np.where(x >= _KVF[15], 15, r))


def _seq(terms):
    acc = None
    for t in terms:
        acc = t.astype(np.float32) if acc is None else (acc + t).astype(np.float32)
    return acc


def _scales(x, qw, nrows, ncols, sbs):
    """First pass of quantize_row_iq4_nl_impl (ntry=7) over super-blocks of sbs weights -> scales [nb, sbs/32]."""
    xb = x[: nrows * ncols].reshape(-1, sbs)
    nsb = xb.shape[0]
    sigma2 = np.zeros(nsb, np.float32)
    for j in range(sbs):
        sigma2 += xb[:, j] * xb[:, j]
    sigma2 = (sigma2 * (_f(2.0) / _f(sbs))).astype(np.float32)
    xs = xb.reshape(-1, 32)
    if qw.size:
        qwb = np.tile(qw.reshape(-1, 32), (nrows, 1))
        w = (qwb * np.sqrt(np.repeat(sigma2, sbs // 32)[:, None] + xs * xs)).astype(np.float32)
    else:
        w = (xs * xs).astype(np.float32)
    vmax = signed_absmax(xs)
    zero = np.abs(vmax) < _f(1e-15)
    with np.errstate(all="ignore"):
        idd = (_f(1) / (-vmax / _f(-127))).astype(np.float32)

        def sums(isc):
            q = _KVF[best_index(isc[:, None] * xs)]
            return _seq(w[:, j] * q[:, j] * xs[:, j] for j in range(32)), _seq(
                w[:, j] * q[:, j] * q[:, j] for j in range(32)
            )

        sumqx, sumq2 = sums(idd)
        d = np.where(sumq2 > 0, sumqx / sumq2, _f(0)).astype(np.float32)
        best = (d * sumqx).astype(np.float32)
        for itry in range(-7, 8):
            sumqx, sumq2 = sums((_f(itry - 127) / vmax).astype(np.float32))
            upd = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
            d = np.where(upd, sumqx / sumq2, d).astype(np.float32)
            best = np.where(upd, d * sumqx, best).astype(np.float32)
    return xb, np.where(zero, _f(0), d).astype(np.float32).reshape(nsb, sbs // 32)


def _pack(L):
    L = L.reshape(-1, 2, 16).astype(np.uint8)
    return (L[:, 0] | (L[:, 1] << np.uint8(4))).reshape(-1)


def quantize_iq4_nl(x, qw, nrows, ncols, out):
    xb, s = _scales(x, qw, nrows, ncols, 32)
    s = s[:, 0]
    with np.errstate(divide="ignore"):
        idd = np.where(s != 0, _f(1) / s, _f(0)).astype(np.float32)
    qs = _pack(best_index(idd[:, None] * xb)).reshape(-1, 16)
    out[: xb.shape[0] * 18].reshape(-1, 18)[:] = np.concatenate(
        [f16_bits(s).view(np.uint8).reshape(-1, 2), qs], 1
    )


def quantize_iq4_xs(x, qw, nrows, ncols, out):
    xb, s = _scales(x, qw, nrows, ncols, 256)
    nb = xb.shape[0]
    best = np.zeros(nb, np.float32)
    max_scale = np.zeros(nb, np.float32)
    for k in range(8):
        upd = np.abs(s[:, k]) > best
        best = np.where(upd, np.abs(s[:, k]), best)
        max_scale = np.where(upd, s[:, k], max_scale)
    d = (-max_scale / _f(32)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idd = np.where(d != 0, _f(1) / d, _f(0)).astype(np.float32)
        lv = np.clip(nearest_int(idd[:, None] * s), -32, 31)
        dl = (d[:, None] * lv.astype(np.float32)).astype(np.float32)
        idl = np.where(dl != 0, _f(1) / dl, _f(0)).astype(np.float32)
    L = best_index(np.repeat(idl, 32, axis=1) * xb)
    lv = lv + 32
    scales_l = ((lv[:, 0::2] & 0xF) | ((lv[:, 1::2] & 0xF) << 4)).astype(np.uint8)
    scales_h = ((lv >> 4) << (2 * np.arange(8))).sum(axis=1).astype("<u2").view(np.uint8).reshape(-1, 2)
    dh = f16_bits(d).view(np.uint8).reshape(-1, 2)
    out[: nb * 136].reshape(-1, 136)[:] = np.concatenate(
        [dh, scales_h, scales_l, _pack(L).reshape(-1, 128)], 1
    )


def dequantize_iq4_nl(raw, n, out):
    b = raw[: n // 32 * 18].reshape(-1, 18)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    q = np.concatenate([b[:, 2:] & np.uint8(15), b[:, 2:] >> np.uint8(4)], axis=1)
    out[:n] = (d * _KVF[q]).ravel()


def dequantize_iq4_xs(raw, n, out):
    b = raw[: n // 256 * 136].reshape(-1, 136)
    d = b[:, :2].copy().view(np.float16).astype(np.float32)
    sh = b[:, 2:4].copy().view("<u2").astype(np.int64)
    sl = b[:, 4:8].astype(np.int64)
    k = np.arange(8)
    ls = ((sl[:, k // 2] >> (4 * (k % 2))) & 15) | (((sh >> (2 * k)) & 3) << 4)
    dl = (d * (ls - 32).astype(np.float32))[..., None]
    qs = b[:, 8:].reshape(-1, 8, 16)
    q = np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=2)
    out[:n] = (dl * _KVF[q]).ravel()
