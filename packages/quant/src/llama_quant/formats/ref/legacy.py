"""Numpy references of the Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 kernels."""

from __future__ import annotations

import numpy as np

from llama_quant.formats.ref.common import (
    f16_bits,
    make_qkx_quants,
    make_qx_quants,
    roundf,
    row_sigma2,
    signed_absmax,
)

__all__ = [
    "dequantize_q4_0",
    "dequantize_q4_1",
    "dequantize_q5_0",
    "dequantize_q5_1",
    "dequantize_q8_0",
    "quantize_q4_0",
    "quantize_q4_1",
    "quantize_q5_0",
    "quantize_q5_1",
    "quantize_q8_0",
]

_f = np.float32


def _blocks(x, nrows, ncols):
    return x[: nrows * ncols].reshape(nrows * ncols // 32, 32)


def _imatrix_weights(x, qw, nrows, ncols):
    # weight = qw * sqrtf(sigma2 + x*x), sigma2 = sum(x^2)/n_per_row per row; -> [nblocks, 32]
    rows = x[: nrows * ncols].reshape(nrows, ncols)
    sigma2 = row_sigma2(rows)
    w = qw[None, :] * np.sqrt(sigma2[:, None] + rows * rows)
    return w.astype(np.float32).reshape(-1, 32)


def _f16_bytes(v):
    return f16_bits(v).view(np.uint8).reshape(-1, 2)


def _pack_nibbles(L):
    L = L.astype(np.uint8)
    return L[:, :16] | (L[:, 16:] << np.uint8(4))


def _pack_qh(L):
    hi = (L.astype(np.uint32) >> np.uint32(4)) & np.uint32(1)
    qh = (hi << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    return qh.astype("<u4").view(np.uint8).reshape(-1, 4)


def _absmax_quants(xb, div, offset, top):
    # quantize_row_q{4,5}_0_ref: d = max / div; q = min(top, (int8)(x*id + offset))
    d = (signed_absmax(xb) / _f(div)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idd = np.where(d != 0, _f(1) / d, _f(0)).astype(np.float32)
    q = np.trunc((xb * idd[:, None]).astype(np.float32) + _f(offset)).astype(np.int64)
    return d, np.minimum(top, q)


def quantize_q4_0(x, qw, nrows, ncols, out):
    xb = _blocks(x, nrows, ncols)
    if qw.size:
        d, L = make_qx_quants(xb, 8, _imatrix_weights(x, qw, nrows, ncols))
    else:
        d, L = _absmax_quants(xb, -8, 8.5, 15)
    out[: xb.shape[0] * 18].reshape(-1, 18)[:] = np.concatenate([_f16_bytes(d), _pack_nibbles(L)], axis=1)


def quantize_q5_0(x, qw, nrows, ncols, out):
    xb = _blocks(x, nrows, ncols)
    if qw.size:
        d, L = make_qx_quants(xb, 16, _imatrix_weights(x, qw, nrows, ncols))
    else:
        d, L = _absmax_quants(xb, -16, 16.5, 31)
    L = L.astype(np.uint8)
    qs = (L[:, :16] & np.uint8(15)) | ((L[:, 16:] & np.uint8(15)) << np.uint8(4))
    out[: xb.shape[0] * 22].reshape(-1, 22)[:] = np.concatenate([_f16_bytes(d), _pack_qh(L), qs], axis=1)


def _quantize_x_1(x, qw, nrows, ncols, nmax):
    xb = _blocks(x, nrows, ncols)
    if qw.size:
        d, the_min, L = make_qkx_quants(
            xb, _imatrix_weights(x, qw, nrows, ncols), nmax, -0.9, 0.05, 36, False, strict=False
        )
        m = (-the_min).astype(np.float32)
    else:
        vmin = np.full(xb.shape[0], np.finfo(np.float32).max, np.float32)
        vmax = -vmin
        for j in range(32):  # sequential, so that ties between 0.0 and -0.0 resolve as in C
            vmin = np.where(xb[:, j] < vmin, xb[:, j], vmin)
            vmax = np.where(xb[:, j] > vmax, xb[:, j], vmax)
        d = ((vmax - vmin) / _f(nmax)).astype(np.float32)
        with np.errstate(divide="ignore"):
            idd = np.where(d != 0, _f(1) / d, _f(0)).astype(np.float32)
        q = np.trunc(((xb - vmin[:, None]) * idd[:, None]).astype(np.float32) + _f(0.5)).astype(np.int64)
        L = np.minimum(15, q) if nmax == 15 else q
        m = vmin
    return xb.shape[0], _f16_bytes(d), _f16_bytes(m), L.astype(np.uint8)


def quantize_q4_1(x, qw, nrows, ncols, out):
    nb, d, m, L = _quantize_x_1(x, qw, nrows, ncols, 15)
    out[: nb * 20].reshape(-1, 20)[:] = np.concatenate([d, m, _pack_nibbles(L)], axis=1)


def quantize_q5_1(x, qw, nrows, ncols, out):
    nb, d, m, L = _quantize_x_1(x, qw, nrows, ncols, 31)
    qs = (L[:, :16] & np.uint8(15)) | ((L[:, 16:] & np.uint8(15)) << np.uint8(4))
    out[: nb * 24].reshape(-1, 24)[:] = np.concatenate([d, m, _pack_qh(L), qs], axis=1)


def quantize_q8_0(x, qw, nrows, ncols, out):
    xb = _blocks(x, nrows, ncols)
    d = (np.abs(xb).max(axis=1) / _f(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idd = np.where(d != 0, _f(1) / d, _f(0)).astype(np.float32)
    q = roundf((xb * idd[:, None]).astype(np.float32)).astype(np.int8).view(np.uint8)
    out[: xb.shape[0] * 34].reshape(-1, 34)[:] = np.concatenate([_f16_bytes(d), q], axis=1)


def _d(b, pos):
    return b[:, pos : pos + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs):
    return np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=1)


def _high_bits(qh):
    bits = qh.copy().view("<u4").astype(np.uint32)
    return ((bits >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)


def dequantize_q4_0(raw, n, out):
    b = raw[: n // 32 * 18].reshape(-1, 18)
    q = _nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)
    out[:n] = (_d(b, 0) * q.astype(np.float32)).ravel()


def dequantize_q4_1(raw, n, out):
    b = raw[: n // 32 * 20].reshape(-1, 20)
    out[:n] = (_d(b, 0) * _nibbles(b[:, 4:]).astype(np.float32) + _d(b, 2)).ravel()


def dequantize_q5_0(raw, n, out):
    b = raw[: n // 32 * 22].reshape(-1, 22)
    q = (_nibbles(b[:, 6:]) | (_high_bits(b[:, 2:6]) << np.uint8(4))).astype(np.int8) - np.int8(16)
    out[:n] = (_d(b, 0) * q.astype(np.float32)).ravel()


def dequantize_q5_1(raw, n, out):
    b = raw[: n // 32 * 24].reshape(-1, 24)
    q = _nibbles(b[:, 8:]) | (_high_bits(b[:, 4:8]) << np.uint8(4))
    out[:n] = (_d(b, 0) * q.astype(np.float32) + _d(b, 2)).ravel()


def dequantize_q8_0(raw, n, out):
    b = raw[: n // 32 * 34].reshape(-1, 34)
    out[:n] = (b[:, 2:].view(np.int8).astype(np.float32) * _d(b, 0)).ravel()
