"""The Mamba-2 layer's kernels (``layers.mamba2``) against their numpy reference (``layers.ref.mamba2``), bit
for bit: two sequences' tokens interleaved in one batch, each advancing its own conv and SSM state, from a
state left by earlier tokens; a dt above softplus's threshold of 20 takes the identity branch."""

from __future__ import annotations

import numpy as np

from llama_engine.layers import Mamba2Shape, ref
from llama_engine.layers.mamba2 import mamba2_conv, mamba2_gate_norm, mamba2_scan

SHAPE = Mamba2Shape(
    d_conv=4, d_inner=30, d_state=8, n_head=6, n_group=2
)  # head_dim 5, conv_dim 62: SIMD tails
EPS = 1e-6


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    s, f32 = SHAPE, np.float32
    return {
        "conv_w": (0.5 * rng.standard_normal((s.conv_dim, s.d_conv))).astype(f32),
        "conv_b": (0.1 * rng.standard_normal(s.conv_dim)).astype(f32),
        "dt_bias": (0.5 * rng.standard_normal(s.n_head)).astype(f32),
        "a": (-np.exp(0.5 * rng.standard_normal(s.n_head))).astype(f32),
        "d": (1.0 + 0.3 * rng.standard_normal(s.n_head)).astype(f32),
        "norm_w": (1.0 + 0.1 * rng.standard_normal(s.d_inner)).astype(f32),
    }


def test_kernels_equal_the_numpy_reference() -> None:
    rng = np.random.default_rng(3)
    s, w = SHAPE, _weights(rng)
    seqs = np.array([0, 1, 1, 0, 1, 0, 0], np.int32)  # two sequences' tokens interleaved
    n = len(seqs)
    zxbcdt = (2.0 * rng.standard_normal((n, s.d_in_proj))).astype(np.float32)
    zxbcdt[2, -1] = 25.0  # softplus(x) = x above 20
    conv0 = rng.standard_normal((2, s.r_dim)).astype(np.float32)  # states left by earlier tokens
    ssm0 = rng.standard_normal((2, s.s_dim)).astype(np.float32)

    conv, ssm = conv0.copy(), ssm0.copy()
    xbc = np.zeros((n, s.conv_dim), np.float32)
    y = np.zeros((n, s.d_inner), np.float32)
    out = np.zeros((n, s.d_inner), np.float32)
    mamba2_conv(xbc, zxbcdt, conv, w["conv_w"], w["conv_b"], seqs, n, s.d_inner, s.d_conv)
    mamba2_scan(y, xbc, zxbcdt, ssm, w["dt_bias"], w["a"], seqs, n, s.d_inner, s.d_state, s.n_head, s.n_group)
    mamba2_gate_norm(
        out, y, xbc, zxbcdt, w["d"], w["norm_w"], np.float32(EPS), n, s.d_inner, s.n_head, s.n_group
    )

    for seq in (0, 1):
        rows = np.flatnonzero(seqs == seq)
        rconv, rssm = conv0[seq].copy(), ssm0[seq].copy()
        want = ref.mamba2(
            zxbcdt[rows], rconv, rssm, w["conv_w"], w["conv_b"], w["dt_bias"], w["a"], w["d"], w["norm_w"],
            s.n_head, s.n_group, s.d_state, EPS,
        )  # fmt: skip
        np.testing.assert_array_equal(out[rows], want)
        np.testing.assert_array_equal(conv[seq], rconv)
        np.testing.assert_array_equal(ssm[seq], rssm)
    assert not np.array_equal(conv, conv0) and not np.array_equal(ssm, ssm0)
