"""Rotary position embeddings as ggml_rope computes them (no YaRN): the cos/sin table and the rotation."""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import numba
import numpy as np

__all__ = ["ROPE_NEOX", "ROPE_NORM", "rope", "rope_cache", "rope_cols"]

ROPE_NORM = 0  # rotate adjacent pairs (x[2i], x[2i+1]): llama
ROPE_NEOX = 2  # rotate halves (x[i], x[i + n/2]): gemma3, qwen2/3, phi3 (GGML_ROPE_TYPE_NEOX)


def rope_cache(n_pos: int, n_dims: int, freq_base: float, freq_scale: float = 1.0) -> np.ndarray:
    """cos/sin table [n_pos, n_dims/2, 2] exactly as ggml_rope_cache_init builds it (no YaRN): theta
    starts at the position and is multiplied by theta_scale = powf(base, -2/n_dims) step by step, in
    float32; cosf/sinf are the C library's (numba calls them for float32 arguments)."""
    theta_scale = _powf(np.float32(freq_base), np.float32(-2.0) / np.float32(n_dims))
    out = np.empty((n_pos, n_dims // 2, 2), np.float32)
    _rope_cache(out, n_pos, n_dims // 2, np.float32(theta_scale), np.float32(freq_scale))
    return out


def _powf(x: np.float32, y: np.float32) -> np.float32:
    """The C library's powf (ggml's), which numpy's float32 power need not equal."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.powf.restype = ctypes.c_float
    libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]
    return np.float32(libm.powf(float(x), float(y)))


@numba.njit(cache=True, nogil=True)
def _rope_cache(
    out: np.ndarray, n_pos: int, half: int, theta_scale: np.float32, freq_scale: np.float32
) -> None:
    for p in range(n_pos):
        theta = np.float32(p)
        for i in range(half):
            t = freq_scale * theta
            out[p, i, 0] = math.cos(t)
            out[p, i, 1] = math.sin(t)
            theta = theta * theta_scale


@numba.njit(cache=True, nogil=True)
def rope(
    x: np.ndarray,
    pos: np.ndarray,
    cache: np.ndarray,
    n: int,
    n_head: int,
    head_dim: int,
    n_dims: int,
    mode: int,
) -> None:
    """Rotate x[n, n_head * head_dim] in place by each token's position (the first n_dims of each head)."""
    rope_cols(x, 0, pos, cache, n, n_head, head_dim, n_dims, mode)


@numba.njit(cache=True, nogil=True, inline="always")
def rope_cols(x, c0, pos, cache, n, n_head, head_dim, n_dims, mode):  # type: ignore[no-untyped-def]
    """``rope`` on the heads stored in x[:, c0 : c0 + n_head * head_dim] (one part of a fused product)."""
    half = n_dims // 2
    for t in range(n):
        p = pos[t]
        for h in range(n_head):
            base = c0 + h * head_dim
            for i in range(half):
                c = cache[p, i, 0]
                s = cache[p, i, 1]
                if mode == ROPE_NEOX:
                    a = base + i
                    b = base + i + half
                else:
                    a = base + 2 * i
                    b = a + 1
                x0 = x[t, a]
                x1 = x[t, b]
                x[t, a] = x0 * c - x1 * s
                x[t, b] = x0 * s + x1 * c
