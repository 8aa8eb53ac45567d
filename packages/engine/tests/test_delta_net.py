"""The gated delta-net kernel (``layers.delta_net``) against its numpy reference (``layers.ref``): tokens of
two sequences interleaved in one call give, for each, the reference's outputs and states to the bit."""

from __future__ import annotations

import numpy as np
import pytest

from llama_engine.layers import ref
from llama_engine.layers.delta_net import delta_net

TAPS = 4
EPS = 1e-6


@pytest.mark.parametrize(
    ("HK", "NK", "HV", "NV"), [(8, 2, 8, 4), (16, 3, 6, 3), (32, 2, 64, 3)]
)  # 6: rows past fours; 64: whole column blocks (_COLS)
def test_delta_net_matches_reference_per_sequence(HK: int, NK: int, HV: int, NV: int) -> None:
    CD = 2 * NK * HK + NV * HV
    rng = np.random.default_rng(3)
    f32 = np.float32
    n = 11
    rows = np.array([0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0], np.int32)
    qkv = rng.standard_normal((n, CD)).astype(f32)
    z = rng.standard_normal((n, NV * HV)).astype(f32)
    beta = rng.standard_normal((n, NV)).astype(f32)
    alpha = (3.0 * rng.standard_normal((n, NV))).astype(f32)  # both sides of softplus's threshold 20
    alpha[2, 1] = 25.0
    w = (0.5 * rng.standard_normal((CD, TAPS))).astype(f32)
    dt_bias = rng.standard_normal(NV).astype(f32)
    a = -np.abs(rng.standard_normal(NV)).astype(f32)
    norm = (1.0 + 0.1 * rng.standard_normal(HV)).astype(f32)
    conv_state = rng.standard_normal((2, CD * (TAPS - 1))).astype(f32)
    ssm_state = (0.1 * rng.standard_normal((2, NV * HV * HK))).astype(f32)
    want_conv, want_ssm = conv_state.copy(), ssm_state.copy()

    y = np.zeros((n, NV * HV), f32)

    # the kernel keeps each head's state S [HK, HV]; the reference ggml's transpose
    def ours(ggml: np.ndarray) -> np.ndarray:
        return ggml.reshape(-1, NV, HV, HK).transpose(0, 1, 3, 2).reshape(ggml.shape).copy()

    ssm_state = ours(ssm_state)
    mixed = np.zeros((n, CD + 2 * NK * HK), f32)
    core = np.zeros((n, NV * HV), f32)
    delta_net(y, qkv, z, beta, alpha, conv_state, ssm_state, w, dt_bias, a, norm, rows, n, HK, NK, HV, NV,
              TAPS, f32(EPS), mixed, core)  # fmt: skip

    for s in (0, 1):
        t = np.flatnonzero(rows == s)
        want = ref.delta_net(
            qkv[t], z[t], beta[t], alpha[t], want_conv[s], want_ssm[s], w, dt_bias, a, norm, HK, NK, HV, EPS
        )
        np.testing.assert_array_equal(y[t], want)
        np.testing.assert_array_equal(conv_state[s], want_conv[s])
        np.testing.assert_array_equal(ssm_state[s], ours(want_ssm[s]))
    assert np.isfinite(y).all() and y.std() > 0
