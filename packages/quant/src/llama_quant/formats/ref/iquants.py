"""Numpy references of the grid i-quant dequantize kernels."""

from __future__ import annotations

import numpy as np

from llama_quant.formats.grids import (
    IQ1S_DELTA,
    IQ1S_GRID,
    IQ2S_GRID,
    IQ2XS_GRID,
    IQ2XXS_GRID,
    IQ3S_GRID,
    IQ3XXS_GRID,
    KSIGNS_IQ2XS,
)

__all__ = [
    "dequantize_iq1_m",
    "dequantize_iq1_s",
    "dequantize_iq2_s",
    "dequantize_iq2_xs",
    "dequantize_iq2_xxs",
    "dequantize_iq3_s",
    "dequantize_iq3_xxs",
]

_f = np.float32
_BITS = np.arange(8, dtype=np.uint8)


def _blocks(raw, n, ts):
    return raw[: n // 256 * ts].reshape(-1, ts)


def _d(b, pos=0):
    return b[:, pos : pos + 2].copy().view(np.float16).astype(np.float32)


def _signs(bytes_):
    # sign bytes [..., k] -> float32 +-1 [..., k, 8]
    return np.where((bytes_[..., None] >> _BITS) & 1, _f(-1), _f(1)).astype(np.float32)


def dequantize_iq2_xxs(raw, n, out):
    b = _blocks(raw, n, 66)
    w = b[:, 2:].copy().view("<u4").reshape(-1, 8, 2).astype(np.uint32)
    db = (_d(b)[:, :, None] * (_f(0.5) + (w[..., 1] >> 28).astype(np.float32))[..., None] * _f(0.25))[
        ..., None
    ]
    idx = w[..., 0:1] >> (8 * np.arange(4, dtype=np.uint32)) & np.uint32(0xFF)
    sg = KSIGNS_IQ2XS[(w[..., 1:2] >> (7 * np.arange(4, dtype=np.uint32))) & np.uint32(127)]
    out[:n] = (db * IQ2XXS_GRID[idx] * _signs(sg)).ravel()


def _sub_scales(sc):
    # 4-bit scales, low nibble first: [nb, k] bytes -> [nb, 2k]
    return np.stack([sc & np.uint8(15), sc >> np.uint8(4)], axis=-1).reshape(sc.shape[0], -1)


def dequantize_iq2_xs(raw, n, out):
    b = _blocks(raw, n, 74)
    q = b[:, 2:66].copy().view("<u2").astype(np.int64)
    db = _d(b) * (_f(0.5) + _sub_scales(b[:, 66:74]).astype(np.float32)) * _f(0.25)
    db = np.repeat(db, 2, axis=1)[..., None]
    out[:n] = (db * IQ2XS_GRID[q & 511] * _signs(KSIGNS_IQ2XS[q >> 9])).ravel()


def dequantize_iq2_s(raw, n, out):
    b = _blocks(raw, n, 82)
    qh = (b[:, 66:74, None].astype(np.int64) >> (2 * np.arange(4))) & 3
    idx = b[:, 2:34].astype(np.int64) | (qh.reshape(-1, 32) << 8)
    db = _d(b) * (_f(0.5) + _sub_scales(b[:, 74:82]).astype(np.float32)) * _f(0.25)
    db = np.repeat(db, 2, axis=1)[..., None]
    out[:n] = (db * IQ2S_GRID[idx] * _signs(b[:, 34:66])).ravel()


def dequantize_iq3_xxs(raw, n, out):
    b = _blocks(raw, n, 98)
    w = b[:, 66:98].copy().view("<u4").astype(np.uint32)
    db = (_d(b) * (_f(0.5) + (w >> 28).astype(np.float32)) * _f(0.5))[..., None, None]
    g = IQ3XXS_GRID[b[:, 2:66]].reshape(-1, 8, 4, 8)
    sg = KSIGNS_IQ2XS[(w[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & np.uint32(127)]
    out[:n] = (db * g * _signs(sg)).ravel()


def dequantize_iq3_s(raw, n, out):
    b = _blocks(raw, n, 110)
    qh = (b[:, 66:74, None] >> _BITS) & 1
    idx = b[:, 2:66].astype(np.int64) | (qh.reshape(-1, 64).astype(np.int64) << 8)
    db = (_d(b) * (1 + 2 * _sub_scales(b[:, 106:110]).astype(np.int64)).astype(np.float32))[..., None]
    g = IQ3S_GRID[idx].reshape(-1, 8, 32)
    out[:n] = (db * g * _signs(b[:, 74:106]).reshape(-1, 8, 32)).ravel()


def dequantize_iq1_s(raw, n, out):
    b = _blocks(raw, n, 50)
    qh = b[:, 34:50].copy().view("<u2").astype(np.int64)
    dl = (_d(b) * (2 * ((qh >> 12) & 7) + 1).astype(np.float32))[..., None, None]
    delta = np.where(qh & 0x8000, -IQ1S_DELTA, IQ1S_DELTA).astype(np.float32)[..., None, None]
    idx = b[:, 2:34].astype(np.int64).reshape(-1, 8, 4) | (((qh[..., None] >> (3 * np.arange(4))) & 7) << 8)
    out[:n] = (dl * (IQ1S_GRID[idx] + delta)).ravel()


def dequantize_iq1_m(raw, n, out):
    b = _blocks(raw, n, 56)
    sc = b[:, 48:56].copy().view("<u2").astype(np.int64)
    dbits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0xF0) | ((sc[:, 2] >> 4) & 0xF00) | (sc[:, 3] & 0xF000)
    d = dbits.astype(np.uint16).view(np.float16).astype(np.float32)[:, None]
    s3 = ((sc[..., None] >> (3 * np.arange(4))) & 7).reshape(-1, 16)
    dl = (d * (2 * s3 + 1).astype(np.float32))[..., None, None]
    qh = _sub_scales(b[:, 32:48]).astype(np.int64)
    idx = (b[:, :32].astype(np.int64) | ((qh & 7) << 8)).reshape(-1, 16, 2)
    delta = np.where(qh & 8, -IQ1S_DELTA, IQ1S_DELTA).astype(np.float32).reshape(-1, 16, 2)[..., None]
    out[:n] = (dl * (IQ1S_GRID[idx] + delta)).ravel()
