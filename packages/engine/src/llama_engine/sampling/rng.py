"""The random numbers of llama.cpp's samplers: std::mt19937 and libstdc++'s distributions.

llama.cpp seeds one ``std::mt19937`` per random sampler (dist, XTC, mirostat) and draws through
``std::uniform_real_distribution`` and ``std::discrete_distribution``. The same seed only gives the
same tokens if every draw is reproduced bit for bit, so the engine and the libstdc++ algorithms are
ported here as numba functions on a flat state array.

State layout: ``uint32[625]``; words 0..623 are the engine state, word 624 is the read index.
"""

from __future__ import annotations

import secrets

import numpy as np
from numba import njit

__all__ = [
    "LLAMA_DEFAULT_SEED",
    "canonical_double",
    "canonical_float",
    "discrete_sample",
    "mt_new",
    "mt_next",
    "mt_seed",
    "resolve_seed",
]

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.h: "use a random seed"

_N = 624
_M = 397
_TWO32 = 4294967296.0
_TWO64 = 18446744073709551616.0
# nextafter(1.0, 0.0): what generate_canonical returns instead of 1.0
_BELOW_ONE_F64 = np.nextafter(np.float64(1.0), np.float64(0.0))
_BELOW_ONE_F32 = np.float32(np.nextafter(np.float32(1.0), np.float32(0.0)))


def resolve_seed(seed: int) -> int:
    """llama-sampler.cpp ``get_rng_seed``: LLAMA_DEFAULT_SEED (or -1) means a fresh random seed."""
    seed &= 0xFFFFFFFF
    if seed == LLAMA_DEFAULT_SEED:
        return secrets.randbits(32)
    return seed


def mt_new(seed: int) -> np.ndarray:
    """A new engine state seeded like ``std::mt19937(seed)``."""
    state = np.empty(_N + 1, dtype=np.uint32)
    mt_seed(state, seed)
    return state


@njit(cache=True, nogil=True)
def mt_seed(state, seed):
    """``std::mt19937::seed(seed)``: the reference init_genrand recurrence."""
    x = np.uint64(seed) & np.uint64(0xFFFFFFFF)
    state[0] = np.uint32(x)
    for i in range(1, _N):
        x = (np.uint64(1812433253) * (x ^ (x >> np.uint64(30))) + np.uint64(i)) & np.uint64(0xFFFFFFFF)
        state[i] = np.uint32(x)
    state[_N] = _N


@njit(cache=True, nogil=True)
def _twist(state):
    for i in range(_N):
        y = (np.uint32(state[i]) & np.uint32(0x80000000)) | (
            np.uint32(state[(i + 1) % _N]) & np.uint32(0x7FFFFFFF)
        )
        v = np.uint32(state[(i + _M) % _N]) ^ np.uint32(y >> np.uint32(1))
        if y & np.uint32(1):
            v = v ^ np.uint32(0x9908B0DF)
        state[i] = v
    state[_N] = 0


@njit(cache=True, nogil=True)
def mt_next(state):
    """Next 32-bit output of the engine (tempered), as an unsigned 64-bit integer."""
    if state[_N] >= _N:
        _twist(state)
    idx = state[_N]
    y = np.uint64(state[idx])
    state[_N] = idx + 1
    y ^= y >> np.uint64(11)
    y ^= (y << np.uint64(7)) & np.uint64(0x9D2C5680)
    y ^= (y << np.uint64(15)) & np.uint64(0xEFC60000)
    y ^= y >> np.uint64(18)
    return y & np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def canonical_double(state):
    """libstdc++ ``generate_canonical<double, 53>``: two engine calls, low word first."""
    lo = np.float64(mt_next(state))
    hi = np.float64(mt_next(state))
    s = lo + hi * _TWO32
    r = s / _TWO64
    if r >= 1.0:
        r = _BELOW_ONE_F64
    return r


@njit(cache=True, nogil=True)
def canonical_float(state):
    """libstdc++ ``generate_canonical<float, 24>``: one engine call, rounded to float first."""
    s = np.float32(mt_next(state))
    r = np.float32(s / np.float32(_TWO32))
    if r >= np.float32(1.0):
        r = _BELOW_ONE_F32
    return r


@njit(cache=True, nogil=True)
def discrete_sample(state, probs, n):
    """libstdc++ ``std::discrete_distribution<int>(probs[:n])(rng)``.

    Fewer than two weights: returns 0 without drawing (libstdc++ keeps no table then).
    Otherwise weights are normalised in double, accumulated with partial_sum, the last
    cumulative value forced to 1.0, and the draw located with lower_bound.
    """
    if n < 2:
        return 0
    total = 0.0
    for i in range(n):
        total += np.float64(probs[i])
    u = canonical_double(state)
    cum = 0.0
    for i in range(n - 1):
        cum += np.float64(probs[i]) / total
        if not (cum < u):
            return i
    return n - 1
