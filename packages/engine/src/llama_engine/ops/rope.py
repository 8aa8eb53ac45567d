"""Rotary position embeddings as ggml_rope computes them: the cos/sin table (with ggml's rope_yarn: linear
frequency scaling, YaRN's ramp between interpolation and extrapolation, the magnitude factor, and the
per-dimension frequency factors of ggml_rope_ext's third operand) and the rotation."""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import numba
import numpy as np

__all__ = ["ROPE_NEOX", "ROPE_NORM", "logf", "rope", "rope_cache", "rope_cols", "yarn_corr_dims"]

ROPE_NORM = 0  # rotate adjacent pairs (x[2i], x[2i+1]): llama
ROPE_NEOX = 2  # rotate halves (x[i], x[i + n/2]): gemma3, qwen2/3, phi3 (GGML_ROPE_TYPE_NEOX)


def rope_cache(
    n_pos: int,
    n_dims: int,
    freq_base: float,
    freq_scale: float = 1.0,
    *,
    ext_factor: float = 0.0,
    attn_factor: float = 1.0,
    corr_dims: tuple[float, float] = (0.0, 0.0),
    freq_factors: np.ndarray | None = None,
) -> np.ndarray:
    """cos/sin table [n_pos, n_dims/2, 2] exactly as ggml_rope_cache_init builds it: theta starts at the
    position and is multiplied by theta_scale = powf(base, -2/n_dims) step by step, in float32; each entry
    is ggml's rope_yarn (freq_scale * theta, mixed with the unscaled theta by the YaRN ramp over corr_dims
    when ext_factor != 0, cos and sin times attn_factor, itself times 1 + 0.1 ln(1/freq_scale) then);
    cosf/sinf/logf are the C library's (numba calls them for float32 arguments). `freq_factors`
    (float32 [n_dims/2]: Llama 3's rope_freqs, Phi-3's longrope factors) divide each dimension's theta
    first, as ggml_rope_cache_init does; without them the divisor is 1 (exact)."""
    theta_scale = _powf(np.float32(freq_base), np.float32(-2.0) / np.float32(n_dims))
    fs, ext = np.float32(freq_scale), np.float32(ext_factor)
    mscale = np.float32(attn_factor)
    if ext != 0:
        mscale = mscale * (np.float32(1.0) + np.float32(0.1) * logf(np.float32(1.0) / fs))
    low, high = np.float32(corr_dims[0]), np.float32(corr_dims[1])
    half = n_dims // 2
    if freq_factors is None:
        ff = np.ones(half, np.float32)
    else:
        ff = np.ascontiguousarray(freq_factors, np.float32)
        if ff.shape != (half,):
            raise ValueError(f"RoPE frequency factors must have {half} values, got shape {ff.shape}")
    out = np.empty((n_pos, half, 2), np.float32)
    _rope_cache(out, n_pos, half, np.float32(theta_scale), fs, ext, np.float32(mscale), low, high, ff)
    return out


def yarn_corr_dims(
    n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float, beta_slow: float
) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the dimensions where the YaRN ramp starts and ends, in float32."""

    def corr_dim(n_rot: float) -> np.float32:
        ratio = np.float32(n_ctx_orig) / (np.float32(n_rot) * np.float32(2) * np.float32(math.pi))
        return np.float32(n_dims) * logf(ratio) / (np.float32(2) * logf(np.float32(freq_base)))

    start = np.floor(corr_dim(beta_fast))
    end = np.ceil(corr_dim(beta_slow))
    return float(max(np.float32(0), start)), float(min(np.float32(n_dims - 1), end))


def _libm() -> ctypes.CDLL:
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.powf.restype = libm.logf.restype = ctypes.c_float
    libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]
    libm.logf.argtypes = [ctypes.c_float]
    return libm


def _powf(x: np.float32, y: np.float32) -> np.float32:
    """The C library's powf (ggml's), which numpy's float32 power need not equal."""
    return np.float32(_libm().powf(float(x), float(y)))


def logf(x: np.float32) -> np.float32:
    """The C library's logf (ggml's)."""
    return np.float32(_libm().logf(float(x)))


@numba.njit(cache=True, nogil=True)
def _rope_cache(
    out: np.ndarray,
    n_pos: int,
    half: int,
    theta_scale: np.float32,
    freq_scale: np.float32,
    ext_factor: np.float32,
    mscale: np.float32,
    low: np.float32,
    high: np.float32,
    ff: np.ndarray,
) -> None:
    one, zero = np.float32(1.0), np.float32(0.0)
    span = max(np.float32(0.001), high - low)
    for p in range(n_pos):
        theta = np.float32(p)
        for i in range(half):
            extrap = theta / ff[i]  # theta_extrap: the dimension's frequency factor divides first
            t = freq_scale * extrap  # theta_interp
            if ext_factor != zero:  # rope_yarn_ramp(low, high, i0) with i0 / 2 == i
                y = (np.float32(i) - low) / span
                ramp = (one - min(one, max(zero, y))) * ext_factor
                t = t * (one - ramp) + extrap * ramp
            out[p, i, 0] = math.cos(t) * mscale
            out[p, i, 1] = math.sin(t) * mscale
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
