"""Numpy references of the TQ1_0 / TQ2_0 kernels."""

from __future__ import annotations

import numpy as np

from llama_quant.formats.ref.common import f16_bits, roundf

__all__ = ["dequantize_tq1_0", "dequantize_tq2_0", "quantize_tq1_0", "quantize_tq2_0"]

_f = np.float32


def _trits(x, qw, nrows, ncols):
    xb = x[: nrows * ncols].reshape(-1, 256)
    d = np.abs(xb).max(axis=1).astype(np.float32)
    with np.errstate(divide="ignore"):
        idd = np.where(d != 0, _f(1) / d, _f(0)).astype(np.float32)
    t = roundf((xb * idd[:, None]).astype(np.float32)).astype(np.int64) + 1
    return xb.shape[0], t, f16_bits(d).view(np.uint8).reshape(-1, 2)


def _pack_base3(t, extra):
    # t [nb, k, m] digits (most significant first along k) -> ceil(q * 256 / 243), with C's uint8 wrapping
    q = np.zeros((t.shape[0], t.shape[2]), np.int64)
    for k in range(t.shape[1]):
        q = (q * 3 + (t[:, k] & 0xFFFFFFFF)) & 0xFF
    q = (q * extra) & 0xFF
    return ((q * 256 + 242) // 243).astype(np.uint8)


def quantize_tq1_0(x, qw, nrows, ncols, out):
    nb, t, dh = _trits(x, qw, nrows, ncols)
    qs0 = _pack_base3(t[:, :160].reshape(nb, 5, 32), 1)
    qs1 = _pack_base3(t[:, 160:240].reshape(nb, 5, 16), 1)
    qh = _pack_base3(t[:, 240:].reshape(nb, 4, 4), 3)  # the 4 digits are shifted up by one trit
    out[: nb * 54].reshape(-1, 54)[:] = np.concatenate([qs0, qs1, qh, dh], axis=1)


def quantize_tq2_0(x, qw, nrows, ncols, out):
    nb, t, dh = _trits(x, qw, nrows, ncols)
    t = (t & 3).reshape(nb, 2, 4, 32) << (2 * np.arange(4)).reshape(1, 1, 4, 1)
    qs = t.sum(axis=2).reshape(nb, 64).astype(np.uint8)
    out[: nb * 66].reshape(-1, 66)[:] = np.concatenate([qs, dh], axis=1)


def _digits(qs, k):
    q = (qs[:, None, :].astype(np.int64) * (3 ** np.arange(k))[None, :, None]) & 0xFF
    return ((q * 3) >> 8) - 1


def dequantize_tq1_0(raw, n, out):
    b = raw[: n // 256 * 54].reshape(-1, 54)
    d = b[:, 52:54].copy().view(np.float16).astype(np.float32)
    nb = b.shape[0]
    t = np.concatenate(
        [
            _digits(b[:, :32], 5).reshape(nb, -1),
            _digits(b[:, 32:48], 5).reshape(nb, -1),
            _digits(b[:, 48:52], 4).reshape(nb, -1),
        ],
        axis=1,
    )
    out[:n] = (d * t.astype(np.float32)).ravel()


def dequantize_tq2_0(raw, n, out):
    b = raw[: n // 256 * 66].reshape(-1, 66)
    d = b[:, 64:66].copy().view(np.float16).astype(np.float32)
    q = (
        b[:, :64].reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)
    ) & np.uint8(3)
    out[:n] = (d * (q.reshape(-1, 256).astype(np.float32) - _f(1))).ravel()
