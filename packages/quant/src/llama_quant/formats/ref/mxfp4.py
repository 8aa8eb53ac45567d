"""Numpy references of the MXFP4 kernels."""

from __future__ import annotations

import numpy as np

__all__ = ["dequantize_mxfp4", "dequantize_nvfp4", "quantize_mxfp4"]

_f = np.float32
_KV = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8).astype(np.float32)


def _e8m0_half(e):
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def quantize_mxfp4(x, qw, nrows, ncols, out):
    xb = x[: nrows * ncols].reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    with np.errstate(divide="ignore"):
        ex = (np.floor(np.log2(amax)).astype(np.float32) - _f(2) + _f(127)).astype(np.float32)
    e = np.where(amax > 0, np.where(amax > 0, ex, _f(0)).astype(np.int64) & 0xFF, 0)
    d = _e8m0_half(e)
    err = np.abs((_KV[None, None, :] * d[:, None, None]).astype(np.float32) - xb[:, :, None])
    best = np.argmin(err, axis=2).astype(np.uint8)  # first of equal errors, like the strict C loop
    qs = best[:, :16] | (best[:, 16:] << np.uint8(4))
    out[: xb.shape[0] * 17].reshape(-1, 17)[:] = np.concatenate([e.astype(np.uint8)[:, None], qs], axis=1)


def dequantize_mxfp4(raw, n, out):
    b = raw[: n // 32 * 17].reshape(-1, 17)
    d = _e8m0_half(b[:, 0])[:, None]
    q = np.concatenate([b[:, 1:] & np.uint8(15), b[:, 1:] >> np.uint8(4)], axis=1)
    out[:n] = (d * _KV[q]).ravel()


def _ue4m3_half(x):
    x = x.astype(np.int64)
    exp = (x >> 3) & 0xF
    man = (x & 7).astype(np.float32)
    normal = ((_f(1) + man / _f(8)) * np.exp2((exp - 7).astype(np.float32))).astype(np.float32)
    raw = np.where(exp == 0, (man * _f(2**-9)).astype(np.float32), normal)
    return np.where((x == 0) | (x == 0x7F), _f(0), (raw * _f(0.5)).astype(np.float32)).astype(np.float32)


def dequantize_nvfp4(raw, n, out):
    b = raw[: n // 64 * 36].reshape(-1, 36)
    d = _ue4m3_half(b[:, :4])[:, :, None]
    qs = b[:, 4:].reshape(-1, 4, 8)
    q = np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=2)
    out[:n] = (d * _KV[q]).ravel()
