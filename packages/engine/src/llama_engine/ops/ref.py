"""Plain-numpy references of the ops kernels, with their signatures, in ggml's order of float operations.

Slow and direct (one token and head at a time, sums as running sums), for the tests that compare each
numba kernel with its reference bit for bit.
"""

from __future__ import annotations

import numpy as np

from . import expf as _e
from .rope import ROPE_NEOX

__all__ = ["attention", "expf", "residual_norm", "rms_norm", "rope"]

_F32, _F64, _U32 = np.float32, np.float64, np.uint32


def _running_sum(terms: np.ndarray, axis: int) -> np.ndarray:
    """Sums in order along ``axis`` (np.sum pairs terms up; a running sum adds them one after another)."""
    return np.asarray(np.cumsum(terms, axis=axis, dtype=_F64).take(-1, axis=axis))


def rms_norm(out: np.ndarray, x: np.ndarray, w: np.ndarray, eps: float, n: int, d: int) -> None:
    for t in range(n):
        row = x[t, :d].astype(_F32)
        acc = _running_sum((row * row).astype(_F64), 0)  # the square in float, the sum in double
        scale = _F32(1.0) / _F32(np.sqrt(_F32(acc / d) + _F32(eps)))
        out[t, :d] = (row * scale) * w[:d]


def residual_norm(x, o, bias, post, w, out, eps, n, d) -> None:  # type: ignore[no-untyped-def]
    if len(bias):
        o[:n] = o[:n] + bias
    if len(post):
        rms_norm(o, o.copy(), post, eps, n, d)
    x[:n] = x[:n] + o[:n]
    if len(w):
        rms_norm(out, x, w, eps, n, d)


def rope(x, pos, cache, n, n_head, head_dim, n_dims, mode) -> None:  # type: ignore[no-untyped-def]
    half = n_dims // 2
    i = np.arange(half)
    for t in range(n):
        c, s = cache[pos[t], :, 0], cache[pos[t], :, 1]
        for h in range(n_head):
            a = h * head_dim + (i if mode == ROPE_NEOX else 2 * i)
            b = a + (half if mode == ROPE_NEOX else 1)
            x0, x1 = x[t, a].copy(), x[t, b].copy()
            x[t, a] = x0 * c - x1 * s
            x[t, b] = x0 * s + x1 * c


def expf(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf (SSE2, no FMA) on a float32 array, every multiply and add rounded to float."""
    x = x.astype(_F32)
    with np.errstate(over="ignore", invalid="ignore"):
        z = x * _e.LOG2E + _e.ROUND
        nn = z - _e.ROUND
        b = x - nn * _e._LN2_HI
        b = b - nn * _e._LN2_LO
        e = z.view(_U32) << _U32(23)
        kk = (e + _U32(0x3F800000)).view(_F32)
        u = b * b
        j = ((_e._P0 * b + _e._P1) * u + (_e._P2 * b + _e._P3)) * u + _e._P4 * b
        main = j * kk + kk
        g = np.where(nn <= 0, _U32(0x82000000), _U32(0)).astype(_U32)
        s1 = (g + _U32(0x7F000000)).view(_F32)
        s2 = (e - g).view(_F32)
        special = np.where(np.abs(nn) > 192, s1 * s1, (s2 * j + s2) * s1)
    return np.where(np.abs(nn) > 126, special, main).astype(_F32)


def _softmax(w: np.ndarray, sink: np.float32 | None = None) -> np.ndarray:
    """ggml_soft_max: exp(w - max) through ggml_v_expf, summed four at a time (SSE2's horizontal sum in
    float) then in double; times 1 / sum in float. A ``sink`` joins the maximum and adds its expf (the C
    library's) to the sum."""
    mx = w.max() if sink is None else max(w.max(), sink)
    e = expf(w - mx)
    padded = np.zeros(-(-len(e) // 4) * 4, _F32)
    padded[: len(e)] = e
    q = padded.reshape(-1, 4)
    total = _running_sum(((q[:, 0] + q[:, 1]) + (q[:, 2] + q[:, 3])).astype(_F64), 0)
    if sink is not None:
        total = total + _F64(_F32(np.exp(_F64(_F32(sink - mx)))))
    return e * _F32(1.0 / total)


def attention(out, q, k, v, cells, lo, hi, n, n_head, n_head_kv, head_dim, scale, sinks=None) -> None:  # type: ignore[no-untyped-def]
    """Token t, head h: softmax(scale * q . k_j) over cells[lo[t]:hi[t]] (and the sink sinks[h], when
    given), then the sum of p_j v_j (the numerics in ``attention.attention``'s doc: f16 K rounds q, f16 V
    rounds the probabilities)."""
    k16, v16 = k.dtype == np.float16, v.dtype == np.float16
    group = n_head // n_head_kv
    for t in range(n):
        rows = cells[lo[t] : hi[t]]
        for h in range(n_head):
            qo, ko = h * head_dim, (h // group) * head_dim
            qh = q[t, qo : qo + head_dim].astype(_F32)
            kh = k[rows, ko : ko + head_dim].astype(_F32)
            vh = v[rows, ko : ko + head_dim].astype(_F32)
            if k16:  # f16 times f16 is exact in float and in double
                qh = qh.astype(np.float16).astype(_F32)
            dots = _running_sum((qh[None, :] * kh).astype(_F64), 1)
            p = _softmax(dots.astype(_F32) * _F32(scale), None if sinks is None else _F32(sinks[h]))
            if v16:
                p = p.astype(np.float16).astype(_F32)
            out[t, qo : qo + head_dim] = _running_sum((p[:, None] * vh).astype(_F64), 0).astype(_F32)
