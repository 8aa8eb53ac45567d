"""IQ4_NL rows as ggml's CPU ``from_float`` writes them into a KV cache (``quantize_row_iq4_nl_ref``).

A cache store converts with the type's ``from_float``; for IQ4_NL that is ``quantize_row_iq4_nl_impl`` with
``ntry = -1`` (``d = max / values[0]``, one pass of levels, the least-squares scale, no candidate scales),
where llama-quant's file quantizer is ggml_quantize_chunk's ``ntry = 7``. The other block types' from_float
equals their chunk quantizer, so they store through llama-quant directly.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from llama_quant.formats.common import absmax_signed, put_f16
from llama_quant.formats.iq4 import KVALUES_IQ4NL, _best_index

__all__ = ["quantize_iq4_nl_ref"]

_EPS = np.float32(1e-15)  # GROUP_MAX_EPS


@numba.njit(cache=True, nogil=True, parallel=True)
def quantize_iq4_nl_ref(x, nrows, ncols, out):  # type: ignore[no-untyped-def]
    """x float32[nrows * ncols] -> out uint8[nrows * ncols / 32 * 18], rows in parallel."""
    nb = ncols // 32
    for r in prange(nrows):
        L = np.zeros(32, np.uint8)
        for ib in range(nb):
            xb = x[r * ncols + ib * 32 : r * ncols + ib * 32 + 32]
            yb = out[(r * nb + ib) * 18 : (r * nb + ib + 1) * 18]
            _block(xb, yb, L)


@numba.njit(cache=True, nogil=True)
def _block(xb, yb, L):  # type: ignore[no-untyped-def]
    v = KVALUES_IQ4NL
    amax, vmax = absmax_signed(xb, 32)
    d = np.float32(0.0)
    if not amax < _EPS:  # a block below the threshold keeps the previous block's levels, as in C
        d = vmax / np.float32(v[0])
        idd = np.float32(1.0) / d
        sumqx = np.float32(0.0)
        sumq2 = np.float32(0.0)
        for j in range(32):
            li = _best_index(idd * xb[j])
            L[j] = li
            q = np.float32(v[li])
            w = xb[j] * xb[j]
            sumqx += w * q * xb[j]
            sumq2 += w * q * q
        d = sumqx / sumq2 if sumq2 > np.float32(0.0) else np.float32(0.0)
    put_f16(yb, 0, d)
    for j in range(16):
        yb[2 + j] = np.uint8(L[j] | (L[j + 16] << 4))
