"""Plain-numpy references for the kernels, with the same signatures as ``llama_quant.kernels``.

Readable, slow, and independent of the repacked layouts: weights are dequantized from ggml's raw blocks
(``dequantize``, written after ggml-quants.c's ``dequantize_row_*``), activations quantized to Q8_0 / Q8_K
(``quantize_q8``) exactly when the kernels do (batches of at most ``BLAS_MIN_TOKENS`` tokens), and the
product is taken in float64.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from .matrix import _SPECS, BLAS_MIN_TOKENS

__all__ = ["dequantize", "matmul", "matvec", "quantize_q8"]


def _f16(b: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 -> [..., 1] f64."""
    return b.copy().view("<f2").astype(np.float64)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] values: low nibbles first, then high nibbles (ggml's 32-block order)."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float64)


def _bits(b: np.ndarray) -> np.ndarray:
    """[..., n] bytes -> [..., 8 n] bits, little-endian within each byte."""
    return np.unpackbits(b, axis=-1, bitorder="little").astype(np.float64)


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    return sc.astype(np.float64), mn.astype(np.float64)


def _deq_blocks(qtype: T, b: np.ndarray) -> np.ndarray:
    """[n_blocks, block_bytes] uint8 -> [n_blocks, block] f64."""
    n = b.shape[0]
    if qtype in (T.Q4_0, T.Q4_1):
        o = 2 if qtype == T.Q4_0 else 4
        q = _nibbles(b[:, o : o + 16])
        return _f16(b[:, 0:2]) * (q - 8) if qtype == T.Q4_0 else _f16(b[:, 0:2]) * q + _f16(b[:, 2:4])
    if qtype in (T.Q5_0, T.Q5_1):
        o = 2 if qtype == T.Q5_0 else 4
        q = _nibbles(b[:, o + 4 : o + 20]) + 16 * _bits(b[:, o : o + 4])
        return _f16(b[:, 0:2]) * (q - 16) if qtype == T.Q5_0 else _f16(b[:, 0:2]) * q + _f16(b[:, 2:4])
    if qtype == T.Q8_0:
        return _f16(b[:, 0:2]) * b[:, 2:34].view(np.int8)
    if qtype in (T.Q4_K, T.Q5_K):
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = _k_scale_min(b[:, 4:16])
        o = 16 if qtype == T.Q4_K else 48
        qs = b[:, o : o + 128].reshape(n, 4, 1, 32)
        q = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.float64).reshape(n, 8, 32)
        if qtype == T.Q5_K:
            hb = _bits(b[:, 16:48]).reshape(n, 32, 8).transpose(0, 2, 1)  # [n, bit, l]
            q += 16 * hb
        return (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]).reshape(n, 256)
    if qtype == T.Q6_K:
        ql, qh = b[:, 0:128].reshape(n, 2, 1, 64), b[:, 128:192].reshape(n, 2, 1, 32)
        lo = np.concatenate([ql & 15, ql >> 4], axis=2).reshape(n, 2, 4, 32)  # [n, half, part, l]
        hi = ((qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3).astype(np.uint8)
        q = (lo | (hi << 4)).astype(np.float64) - 32
        sc = b[:, 192:208].view(np.int8).astype(np.float64).reshape(n, 2, 4, 2, 1)  # [n, half, part, l/16]
        w = _f16(b[:, 208:210])[:, :, None, None, None] * sc * q.reshape(n, 2, 4, 2, 16)
        return w.reshape(n, 256)
    if qtype == T.Q2_K:
        d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
        qs = b[:, 16:80].reshape(n, 2, 1, 32)
        q = ((qs >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3).astype(np.float64)
        s = b[:, 0:16].reshape(n, 2, 4, 2, 1)
        w = d[:, :, None, None, None] * (s & 15) * q.reshape(n, 2, 4, 2, 16) - dmin[
            :, :, None, None, None
        ] * (s >> 4)
        return w.reshape(n, 256)
    if qtype == T.Q3_K:
        from .kq import _q3_scales

        d = _f16(b[:, 108:110])
        qs = b[:, 32:96].reshape(n, 2, 1, 32)
        low2 = ((qs >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3).astype(np.float64)
        hm = _bits(b[:, 0:32]).reshape(n, 32, 8).transpose(0, 2, 1).reshape(n, 2, 4, 32)
        q3 = low2 - 4 * (1 - hm)  # the hmask bit clear means -4
        sc = _q3_scales(b[:, 96:108]).astype(np.float64).reshape(n, 2, 4, 2, 1)
        return (d[:, :, None, None, None] * sc * q3.reshape(n, 2, 4, 2, 16)).reshape(n, 256)
    raise ValueError(qtype)


def dequantize(w_raw: np.ndarray, qtype: T | int, rows: int, cols: int) -> np.ndarray:
    """Raw ggml bytes -> W[rows, cols] f64."""
    qtype = T(qtype)
    raw = np.asarray(w_raw).reshape(-1).view(np.uint8)
    if qtype == T.F32:
        return raw.view("<f4").astype(np.float64).reshape(rows, cols)
    if qtype == T.F16:
        return raw.view("<f2").astype(np.float64).reshape(rows, cols)
    if qtype == T.BF16:
        return (raw.view("<u2").astype(np.uint32) << 16).view("<f4").astype(np.float64).reshape(rows, cols)
    spec = _SPECS[qtype]
    return _deq_blocks(qtype, raw.reshape(-1, spec.block_bytes)).reshape(rows, cols)


def quantize_q8(x: np.ndarray, block: int) -> np.ndarray:
    """x[n, cols] -> its Q8 round trip (f64): per block of ``block`` values, d = amax / 127 and
    q = round-half-even(x / d), the activation quantization of the kernels (Q8_0: 32, Q8_K: 256)."""
    xb = np.asarray(x, np.float32).reshape(x.shape[0], -1, block)
    d = np.abs(xb).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = np.rint(xb * inv)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


def _activations(qtype: T, x: np.ndarray) -> np.ndarray:
    act = _SPECS[qtype].act
    if act == "f32" or x.shape[0] > BLAS_MIN_TOKENS:
        return x.astype(np.float64)
    return quantize_q8(x, 32 if act == "q8_0" else 256)


def matmul(out: np.ndarray, w_raw: np.ndarray, qtype: T | int, rows: int, cols: int, x: np.ndarray) -> None:
    """out[n, rows] = X[n, cols] @ W.T in f64 (stored as out's dtype)."""
    x2 = np.asarray(x, np.float32).reshape(-1, cols)
    out[...] = (_activations(T(qtype), x2) @ dequantize(w_raw, qtype, rows, cols).T).reshape(out.shape)


def matvec(out: np.ndarray, w_raw: np.ndarray, qtype: T | int, rows: int, cols: int, x: np.ndarray) -> None:
    """out[rows] = W[rows, cols] @ x[cols] in f64 (stored as out's dtype)."""
    matmul(out.reshape(1, rows), w_raw, qtype, rows, cols, np.asarray(x).reshape(1, cols))
