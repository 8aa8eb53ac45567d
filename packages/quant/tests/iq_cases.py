"""Weights of the i-quant and ternary types for the exact-kernel tests: random blocks (every bit pattern of
the quants is a valid block) with a sane scale, or llama-quant's own output where it quantizes the type."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

import llama_quant

IQ_TYPES = [
    T.IQ4_NL,
    T.IQ4_XS,
    T.MXFP4,
    T.TQ1_0,
    T.TQ2_0,
    T.IQ1_S,
    T.IQ1_M,
    T.IQ2_XXS,
    T.IQ2_XS,
    T.IQ2_S,
    T.IQ3_XXS,
    T.IQ3_S,
]
# byte offset of the fp16 super-block scale (IQ1_M keeps it in the top nibbles of its 4 scales; MXFP4 has
# an e8m0 exponent in byte 0)
_D_AT = {T.TQ1_0: 52, T.TQ2_0: 64}


def random_blocks(qtype: T, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """ggml bytes of a ``rows`` x ``cols`` matrix of ``qtype``: random quants, scales around 1e-2."""
    rng = np.random.default_rng(seed)
    block, nbytes = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (rows * cols // block, nbytes), dtype=np.uint8)
    d = (rng.random(len(b)) * 0.02 + 1e-3).astype(np.float16).view(np.uint16)
    if qtype == T.MXFP4:
        b[:, 0] = rng.integers(100, 135, len(b))  # 2^-28 .. 2^6
        b[::7, 0] = rng.integers(0, 256, len(b[::7]))  # every exponent, even those fp16 cannot hold
    elif qtype == T.IQ1_M:
        for k in range(4):
            w = b[:, 48 + 2 * k : 50 + 2 * k].copy().view(np.uint16)[:, 0]
            w = (w & 0x0FFF) | (((d >> (4 * k)) & 15) << 12)
            b[:, 48 + 2 * k : 50 + 2 * k] = w.astype(np.uint16).view(np.uint8).reshape(-1, 2)
    else:
        o = _D_AT.get(qtype, 0)
        b[:, o : o + 2] = d.view(np.uint8).reshape(-1, 2)
    return b.reshape(-1)


# quantized by llama-quant in the tests (fast, no importance matrix); the grid types take random blocks
_QUANTIZED = (T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.TQ1_0, T.TQ2_0)


def iq_weights(qtype: T, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """For even seeds, llama-quant's bytes of a random normal matrix where it quantizes ``qtype`` quickly
    without an importance matrix; else ``random_blocks``."""
    if seed % 2 == 0 and qtype in _QUANTIZED:
        rng = np.random.default_rng(seed)
        return llama_quant.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    return random_blocks(qtype, rows, cols, seed)
