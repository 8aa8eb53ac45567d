"""The element-wise FFN activations: the vector-lane and threaded forms give ggml's numbers, for rows on
ggml_v_expf's main path and rows that leave it, with a scalar remainder."""

from __future__ import annotations

import math

import numpy as np

from llama_engine import ops
from llama_engine.ops.expf import expf_sse2


def _swiglu_reference(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml_vec_swiglu_f32 element by element: the SSE2 silu on groups of four, scalar expf after."""
    out = np.empty_like(g)
    simd = len(g) - len(g) % 4
    one = np.float32(1.0)
    with np.errstate(over="ignore"):  # expf(100) is inf in float32, as in C
        for i, (gi, ui) in enumerate(zip(g, u, strict=True)):
            e = expf_sse2(np.float32(0.0) - gi) if i < simd else np.float32(math.exp(-gi))
            out[i] = gi / (one + e) * ui
    return out


def test_swiglu_matches_ggml_definition_alone_and_threaded() -> None:
    rng = np.random.default_rng(0)
    n, d = 12, 39  # threaded from 8 tokens; 3 values after the groups of four
    gate = (rng.standard_normal((n, d)) * 6).astype(np.float32)
    gate[3, 5] = 95.0  # off the main path: that row takes the scalar form
    gate[7, 0] = -120.0
    gate[9, 38] = -100.0  # in the remainder only
    up = rng.standard_normal((n, d)).astype(np.float32)
    want = np.stack([_swiglu_reference(gate[t], up[t]) for t in range(n)])
    threaded = np.empty_like(gate)
    ops.swiglu(threaded, gate, up, n, d)
    assert np.array_equal(threaded, want)
    for t in (0, 3, 7, 9):
        one = np.empty((1, d), np.float32)
        ops.swiglu(one, gate[t : t + 1], up[t : t + 1], 1, d)
        assert np.array_equal(one[0], want[t])


def test_geglu_alone_equals_threaded() -> None:
    rng = np.random.default_rng(1)
    n, d = 10, 50
    gate = (rng.standard_normal((n, d)) * 5).astype(np.float32)
    up = rng.standard_normal((n, d)).astype(np.float32)
    threaded = np.empty_like(gate)
    ops.geglu(threaded, gate, up, n, d)
    table = ops.gelu_table()
    bits = gate.astype(np.float16).view(np.uint16)
    y = np.where(gate <= -10, np.float32(0), np.where(gate >= 10, gate, table[bits]))
    assert np.array_equal(threaded, (y * up).astype(np.float32))
    for t in range(2):
        one = np.empty((1, d), np.float32)
        ops.geglu(one, gate[t : t + 1], up[t : t + 1], 1, d)
        assert np.array_equal(one[0], threaded[t])


def test_fused_gate_up_columns_equal_separate_arrays() -> None:
    """One [gate | up] product passed with column offsets gives what separate gate and up arrays give."""
    rng = np.random.default_rng(2)
    for n in (1, 9):
        both = (rng.standard_normal((n, 2 * 37)) * 4).astype(np.float32)
        gate, up = both[:, :37].copy(), both[:, 37:].copy()
        for glu in (ops.swiglu, ops.geglu):
            fused = np.empty((n, 37), np.float32)
            glu(fused, both, both, n, 37, 0, 37)
            apart = np.empty((n, 37), np.float32)
            glu(apart, gate, up, n, 37)
            assert np.array_equal(fused, apart)
