"""Plain-numpy references of the layer kinds' kernels, in ggml's order of float operations.

Slow and direct (one token at a time, one matrix-vector product per token and expert, no grouping), for
the tests that compare the layers and ``routing``'s kernels with them bit for bit. The matrices' own
products are ``ExactMatrix.matvec`` (tested against libggml in llama-quant).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llama_quant.kernels import ExactMatrix

from ..ops.ref import expf
from .routing import WEIGHTS_SUM_MIN, Gating

__all__ = ["moe_ffn", "route", "silu", "soft_max"]

_F32, _F64 = np.float32, np.float64


def soft_max(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max of one row (SSE2): ggml_v_expf on groups of four summed in float, (v0 + v1) + (v2 + v3),
    then in double; the tail through the C library's expf; times 1 / sum in float."""
    x = x.astype(_F32)
    e = x - x.max()
    simd = len(x) - len(x) % 4
    y = np.empty_like(e)
    y[:simd] = expf(e[:simd])
    y[simd:] = np.exp(e[simd:].astype(_F64)).astype(_F32)
    q = y[:simd].reshape(-1, 4)
    terms = [*((q[:, 0] + q[:, 1]) + (q[:, 2] + q[:, 3])).astype(_F64), *y[simd:].astype(_F64)]
    total = _F64(0.0)
    for v in terms:
        total += v
    return y * _F32(1.0 / total)


def silu(x: np.ndarray) -> np.ndarray:
    """ggml_vec_silu_f32 (SSE2): x / (1 + ggml_v_expf(-x)) on groups of four, the C library's expf after."""
    x = x.astype(_F32)
    simd = len(x) - len(x) % 4
    e = np.empty_like(x)
    e[:simd] = expf(-x[:simd])
    e[simd:] = np.exp(-x[simd:].astype(_F64)).astype(_F32)
    return x / (_F32(1.0) + e)


def route(
    logits: np.ndarray, k: int, gating: Gating, norm: bool, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """(selected [k], weights [k]) of one token's router logits [n_expert], as build_moe_ffn; ties keep
    index order (libstdc++'s std::sort does, for 16 experts or fewer)."""
    if gating == Gating.SOFTMAX:
        p = soft_max(logits)
    elif gating == Gating.SIGMOID:
        p = (_F32(1.0) / (_F32(1.0) + np.exp(-logits.astype(_F64)).astype(_F32))).astype(_F32)
    else:
        p = logits.astype(_F32)
    sel = np.argsort(-p, kind="stable")[:k]
    w = p[sel]
    if gating == Gating.SOFTMAX_WEIGHT:
        w = soft_max(w)
    if norm:
        s = max(_F32(np.cumsum(w.astype(_F64))[-1]), WEIGHTS_SUM_MIN)
        w = w / s
    if scale not in (0.0, 1.0):
        w = w * _F32(scale)
    return sel, w.astype(_F32)


def _swiglu_ffn(x: np.ndarray, gate: ExactMatrix, up: ExactMatrix, down: ExactMatrix) -> np.ndarray:
    """build_ffn with a parallel gate: down @ (silu(gate @ x) * up @ x)."""
    return down.matvec(silu(gate.matvec(x)) * up.matvec(x))


def moe_ffn(
    x: np.ndarray,
    router: ExactMatrix,
    gate: Sequence[ExactMatrix],
    up: Sequence[ExactMatrix],
    down: Sequence[ExactMatrix],
    k: int,
    gating: Gating,
    norm: bool,
    scale: float,
    shared: tuple[ExactMatrix, ExactMatrix, ExactMatrix] | None = None,
    shared_gate: ExactMatrix | None = None,
) -> np.ndarray:
    """build_moe_ffn for x [n, n_embd]: per token, the top-k experts' SwiGLU FFNs weighted and added in slot
    order; plus the shared expert (gate, up, down) times silu(g) / g of its gate's logit g (qwen2moe)."""
    out = np.empty_like(x, dtype=_F32)
    for t in range(len(x)):
        sel, w = route(router.matvec(x[t]), k, gating, norm, scale)
        acc = _swiglu_ffn(x[t], gate[sel[0]], up[sel[0]], down[sel[0]]) * w[0]
        for i in range(1, k):
            acc = acc + _swiglu_ffn(x[t], gate[sel[i]], up[sel[i]], down[sel[i]]) * w[i]
        if shared is not None:
            sh = _swiglu_ffn(x[t], *shared)
            if shared_gate is not None:
                g = shared_gate.matvec(x[t])
                sh = sh * (silu(g) / g)[0]
            acc = acc + sh
        out[t] = acc
    return out
