"""Inputs shared by the exact-kernel tests: weights of every type and hostile activation batches."""

from __future__ import annotations

import numpy as np
from conftest import make_matrix
from gguf import GGMLQuantizationType as T

import llama_quant

TYPES = [T.Q4_1, T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K, T.Q4_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q5_K, T.F16, T.F32, T.BF16]
ACT_KINDS = ("normal", "outliers", "zeros", "tiny", "subnormal", "huge", "ties", "mixed")


def raw_weights(qtype: T, w: np.ndarray) -> np.ndarray:
    """ggml bytes of the f32 matrix ``w`` in ``qtype``."""
    if qtype == T.F32:
        return np.ascontiguousarray(w, np.float32).reshape(-1).view(np.uint8)
    if qtype == T.F16:
        return w.astype(np.float16).reshape(-1).view(np.uint8)
    if qtype == T.BF16:
        return (
            (np.ascontiguousarray(w, np.float32).view(np.uint32) >> 16)
            .astype(np.uint16)
            .reshape(-1)
            .view(np.uint8)
        )
    return llama_quant.quantize(w, qtype)


def make_acts(kind: str, n: int, cols: int, seed: int = 0) -> np.ndarray:
    """float32 [n, cols] activations of one of ACT_KINDS."""
    rng = np.random.default_rng(seed + 77)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    if kind == "outliers":
        x[rng.random((n, cols)) < 0.01] *= np.float32(60.0)
    elif kind == "zeros":
        x[:, : min(cols, 256)] = 0.0  # whole zero blocks (Q8_0 d = 0, Q8_K amax = 0)
        x[rng.random((n, cols)) < 0.2] = 0.0
        x[0, 300:310] = -0.0
    elif kind == "tiny":
        x *= np.float32(1e-30)  # fp16(d) underflows to a subnormal or to 0
    elif kind == "subnormal":
        # 1 / d overflows to inf (Q8_0: id; Q8_K: iscale): the quants come from C's conversions of inf / nan
        x *= np.float32(1e-39)
        x[:, ::7] = 0.0
    elif kind == "huge":
        x *= np.float32(3e4)
        x[0, :32] *= np.float32(1000.0)  # fp16(d) overflows to inf
    elif kind == "ties":
        # a block max of +-127 makes d = 1 (Q8_0: id = 1; Q8_K: iscale = -+1): values k + 0.5 are exact ties
        x = (rng.integers(-126, 126, (n, cols)) + np.float32(0.5)).astype(np.float32)
        x[:, ::32] = np.float32(127.0)
        x[1 % n, ::64] = np.float32(-127.0)
    elif kind == "mixed":
        x *= np.exp(rng.normal(0.0, 3.0, (n, 1, cols // 16)).astype(np.float32)).repeat(16, axis=2)[:, 0]
    elif kind != "normal":
        raise ValueError(kind)
    return np.ascontiguousarray(x, np.float32)


def weights(qtype: T, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    kind = ("normal", "outliers", "zero_rows", "uniform")[seed % 4]
    return raw_weights(qtype, make_matrix(kind, rows, cols, seed))
