"""RMS norm (ggml_rms_norm then ggml_mul) and the residual step around it.

The sum of squares accumulates in double (ggml_float), the square in float, the scale in float. A residual
step (``residual_norm``) does in one call what the graph does between two blocks: the block output's bias
and post-norm (where the architecture has them), the residual add, and the next block's input norm.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

__all__ = ["PARALLEL_ROWS", "output_norm", "residual_norm", "rms_norm"]

PARALLEL_ROWS = 8  # from this many rows on, the row-wise steps (norms, FFN activations) use all threads


def rms_norm(out: np.ndarray, x: np.ndarray, w: np.ndarray, eps: float, n: int, d: int) -> None:
    """out[n, d] = x / sqrt(mean(x^2) + eps) * w[d]   (ggml_rms_norm, then ggml_mul). Many rows spread over
    the threads; ``out`` may be ``x``."""
    (_rms_norm_rows if n >= PARALLEL_ROWS else _rms_norm)(out, x, w, eps, n, d)


@numba.njit(cache=True, nogil=True)
def _rms_norm(out, x, w, eps, n, d):  # type: ignore[no-untyped-def]
    for t in range(n):
        rms_norm_row(out[t], x[t], w, eps, d)


@numba.njit(cache=True, nogil=True, parallel=True)
def _rms_norm_rows(out, x, w, eps, n, d):  # type: ignore[no-untyped-def]
    for t in prange(n):
        rms_norm_row(out[t], x[t], w, eps, d)


@numba.njit(cache=True, nogil=True, inline="always")
def rms_norm_row(o, x, w, eps, d):  # type: ignore[no-untyped-def]
    """One row of ``rms_norm`` (``o`` may be ``x``: each element is read before it is written)."""
    acc = 0.0  # ggml_float: double accumulation
    for i in range(d):
        acc += np.float64(x[i] * x[i])  # the square in float, the sum in double
    scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(acc / d) + np.float32(eps)))
    for i in range(d):
        o[i] = (x[i] * scale) * w[i]


def residual_norm(
    x: np.ndarray,
    o: np.ndarray,
    bias: np.ndarray,
    post: np.ndarray,
    w: np.ndarray,
    out: np.ndarray,
    eps: float,
    n: int,
    d: int,
) -> None:
    """Per row: o += bias, o = rms_norm(o) * post, x += o, out = rms_norm(x) * w; each of bias, post and w
    is skipped when empty (length 0). x, o, out: [n, d] float32 (o is overwritten)."""
    (_residual_rows if n >= PARALLEL_ROWS else _residual)(x, o, bias, post, w, out, eps, n, d)


@numba.njit(cache=True, nogil=True)
def _residual(x, o, bias, post, w, out, eps, n, d):  # type: ignore[no-untyped-def]
    for t in range(n):
        _residual_row(x[t], o[t], bias, post, w, out[t], eps, d)


@numba.njit(cache=True, nogil=True, parallel=True)
def _residual_rows(x, o, bias, post, w, out, eps, n, d):  # type: ignore[no-untyped-def]
    for t in prange(n):
        _residual_row(x[t], o[t], bias, post, w, out[t], eps, d)


@numba.njit(cache=True, nogil=True, inline="always")
def _residual_row(x, o, bias, post, w, out, eps, d):  # type: ignore[no-untyped-def]
    if len(bias):
        for i in range(d):
            o[i] = o[i] + bias[i]
    if len(post):
        rms_norm_row(o, o, post, eps, d)
    for i in range(d):
        x[i] = x[i] + o[i]
    if len(w):
        rms_norm_row(out, x, w, eps, d)


@numba.njit(cache=True, nogil=True)
def output_norm(out, x, keep, w, eps, n, d):  # type: ignore[no-untyped-def]
    """out[m] = rms_norm(x[t]) * w for the rows t with keep[t], in order; returns their count m."""
    m = 0
    for t in range(n):
        if keep[t]:
            rms_norm_row(out[m], x[t], w, eps, d)
            m += 1
    return m
