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
from .moe import OAI_ALPHA, OAI_LIMIT
from .routing import WEIGHTS_SUM_MIN, Gating

__all__ = ["delta_net", "mamba2", "moe_ffn", "route", "short_conv", "silu", "soft_max", "swiglu_oai"]

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


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """ggml_swiglu_oai: min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, -limit, limit) + 1), in
    float, the sigmoid as x / (1 + expf(alpha * -x)) with the C library's expf."""
    a, lim = _F32(alpha), _F32(limit)
    x = np.minimum(gate.astype(_F32), lim)
    y = np.clip(up.astype(_F32), -lim, lim)
    with np.errstate(over="ignore"):  # expf overflows to inf, as the C library's does
        e = np.exp((a * -x).astype(_F64)).astype(_F32)
    return (x / (_F32(1.0) + e)) * (y + _F32(1.0))


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


def _swiglu_ffn(
    x: np.ndarray,
    gate: ExactMatrix,
    up: ExactMatrix,
    down: ExactMatrix,
    biases: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    oai: bool = False,
) -> np.ndarray:
    """build_ffn with a parallel gate: down @ (silu(gate @ x) * up @ x); with ``biases`` (gate, up, down)
    each added to its product, with ``oai`` swiglu_oai in silu's place."""
    g, u = gate.matvec(x), up.matvec(x)
    if biases is not None:
        g, u = g + biases[0], u + biases[1]
    y = down.matvec(swiglu_oai(g, u, OAI_ALPHA, OAI_LIMIT) if oai else silu(g) * u)
    return y if biases is None else y + biases[2]


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
    router_bias: np.ndarray | None = None,
    biases: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    oai: bool = False,
) -> np.ndarray:
    """build_moe_ffn for x [n, n_embd]: per token, the top-k experts' SwiGLU FFNs weighted and added in slot
    order; plus the shared expert (gate, up, down) times silu(g) / g of its gate's logit g (qwen2moe).
    gpt-oss: ``router_bias`` added to the router's logits, ``biases`` the experts' (gate [n_expert, n_ff],
    up, down [n_expert, n_embd]), ``oai`` the swiglu_oai activation."""
    out = np.empty_like(x, dtype=_F32)

    def ffn(t: int, e: int) -> np.ndarray:
        b = None if biases is None else (biases[0][e], biases[1][e], biases[2][e])
        return _swiglu_ffn(x[t], gate[e], up[e], down[e], b, oai)

    for t in range(len(x)):
        logits = router.matvec(x[t])
        if router_bias is not None:
            logits = logits + router_bias
        sel, w = route(logits, k, gating, norm, scale)
        acc = ffn(t, sel[0]) * w[0]
        for i in range(1, k):
            acc = acc + ffn(t, sel[i]) * w[i]
        if shared is not None:
            sh = _swiglu_ffn(x[t], *shared)
            if shared_gate is not None:
                g = shared_gate.matvec(x[t])
                sh = sh * (silu(g) / g)[0]
            acc = acc + sh
        out[t] = acc
    return out


def short_conv(
    y: np.ndarray,
    bcx: np.ndarray,
    state: np.ndarray,
    w: np.ndarray,
    rows: np.ndarray,
    n: int,
    d: int,
    d_conv: int,
) -> None:
    """``short_conv.short_conv`` in numpy: the window of d_conv + 1 inputs per channel, its taps summed in
    float one by one from the oldest (ggml_ssm_conv), then c times the sum."""
    for t in range(n):
        st = state[rows[t]].reshape(d, d_conv)
        bx = (bcx[t, :d] * bcx[t, 2 * d :]).astype(_F32)
        window = np.concatenate([st, bx[:, None]], axis=1)
        acc = np.zeros(d, _F32)
        for k in range(d_conv + 1):
            acc = (acc + window[:, k] * w[:, k]).astype(_F32)
        st[:] = window[:, 1:]
        y[t] = bcx[t, d : 2 * d] * acc


def mamba2(
    zxbcdt: np.ndarray,
    conv_state: np.ndarray,
    ssm_state: np.ndarray,
    conv_w: np.ndarray,
    conv_b: np.ndarray,
    dt_bias: np.ndarray,
    a: np.ndarray,
    d: np.ndarray,
    norm_w: np.ndarray,
    n_head: int,
    n_group: int,
    d_state: int,
    eps: float,
) -> np.ndarray:
    """build_mamba2_layer between ssm_in and ssm_out for one sequence's tokens zxbcdt [n, d_in_proj],
    advancing its conv state [conv_dim * (d_conv - 1)] and SSM state [n_head * head_dim * d_state] in place;
    returns ssm_out's input [n, d_inner]. In ggml's order: the conv taps summed in float from the oldest
    input, SiLU and SwiGLU as ``silu`` on each row (xBC's; each head's), softplus and the decay through
    libm-rounded logf / expf, the scan's dot over d_state summed in float, the group RMS norm as
    ggml_rms_norm (squares summed in double)."""
    n = len(zxbcdt)
    d_conv = conv_w.shape[1]
    conv_dim = conv_w.shape[0]
    d_inner = conv_dim - 2 * n_group * d_state
    hd, gs = d_inner // n_head, d_inner // n_group
    cst = conv_state.reshape(conv_dim, d_conv - 1)
    sst = ssm_state.reshape(n_head, hd, d_state)
    out = np.empty((n, d_inner), _F32)
    for t in range(n):
        z, xbc_in, dt = np.split(zxbcdt[t], [d_inner, d_inner + conv_dim])
        window = np.concatenate([cst, xbc_in[:, None]], axis=1)
        acc = np.zeros(conv_dim, _F32)
        for k in range(d_conv):
            acc = (acc + window[:, k] * conv_w[:, k]).astype(_F32)
        cst[:] = window[:, 1:]
        xbc = silu(acc + conv_b)
        x = xbc[:d_inner].reshape(n_head, hd)
        bb = xbc[d_inner : d_inner + n_group * d_state].reshape(n_group, d_state)
        cc = xbc[d_inner + n_group * d_state :].reshape(n_group, d_state)
        y = np.empty((n_head, hd), _F32)
        for h in range(n_head):
            v = _F32(dt[h] + dt_bias[h])
            sp = v if v > _F32(20.0) else _F32(np.log(_F64(_F32(1.0) + _F32(np.exp(_F64(v))))))
            da = _F32(np.exp(_F64(_F32(sp * a[h]))))
            g = h // (n_head // n_group)
            sst[h] = sst[h] * da + bb[g][None, :] * (x[h] * sp)[:, None]
            prod = sst[h] * cc[g][None, :]
            s = np.zeros(hd, _F32)
            for i in range(d_state):
                s = (s + prod[:, i]).astype(_F32)
            y[h] = s
        yd = y + x * d[:, None]
        gated = np.concatenate([silu(z[h * hd : (h + 1) * hd]) * yd[h] for h in range(n_head)])
        for g in range(n_group):
            row = gated[g * gs : (g + 1) * gs]
            ms = _F32(sum(float(v) for v in row * row) / gs)  # the squares in float, summed in double
            scale = _F32(1.0) / _F32(np.sqrt(ms + _F32(eps)))
            out[t, g * gs : (g + 1) * gs] = (row * scale) * norm_w[g * gs : (g + 1) * gs]
    return out


def _rms(x: np.ndarray, eps: np.float32) -> np.ndarray:
    """ggml_rms_norm's factor of each row of x [..., d]: squares in float summed in double."""
    ss = np.zeros(x.shape[:-1], _F64)
    for i in range(x.shape[-1]):
        ss += (x[..., i] * x[..., i]).astype(_F64)
    return _F32(1.0) / np.sqrt((ss / x.shape[-1]).astype(_F32) + eps).astype(_F32)


def _dots(m: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 of each row of m with x (no SIMD): float products summed in order in double."""
    acc = np.zeros(m.shape[0], _F64)
    for i in range(m.shape[1]):
        acc += (m[:, i] * x[i]).astype(_F64)
    return acc.astype(_F32)


def delta_net(
    qkv: np.ndarray,
    z: np.ndarray,
    beta: np.ndarray,
    alpha: np.ndarray,
    conv_state: np.ndarray,
    ssm_state: np.ndarray,
    w: np.ndarray,
    dt_bias: np.ndarray,
    a: np.ndarray,
    norm: np.ndarray,
    hk: int,
    nk: int,
    hv: int,
    eps: float,
) -> np.ndarray:
    """The gated delta-net of one sequence's tokens (``delta_net.delta_net``), its states advanced in place.

    qkv [n, conv_dim]; z [n, nv * hv]; beta, alpha [n, nv]; conv_state [conv_dim * (taps - 1)];
    ssm_state [nv * hv * hk] (per head M[j, i] = S[i, j]); w [conv_dim, taps]. Returns [n, nv * hv]: the
    convolution (taps summed in float from the oldest), SiLU, q and k L2-normed (rms_norm(x, eps / hk) /
    sqrtf(hk)), the fused ggml_gated_delta_net's steps per token (dot products in double), the per-head
    RMS norm times ssm_norm and silu(z)."""
    n, cd = qkv.shape
    taps = w.shape[1]
    nv = len(a)
    e = _F32(eps)
    one = _F32(1.0)
    cs = conv_state.reshape(cd, taps - 1)
    m_all = ssm_state.reshape(nv, hv, hk)
    out = np.zeros((n, nv * hv), _F32)
    for t in range(n):
        window = np.concatenate([cs, qkv[t][:, None]], axis=1)
        acc = np.zeros(cd, _F32)
        for tap in range(taps):
            acc = acc + window[:, tap] * w[:, tap]
        cs[:] = window[:, 1:]
        c = silu(acc)
        q = c[: nk * hk].reshape(nk, hk)
        k = c[nk * hk : 2 * nk * hk].reshape(nk, hk)
        v = c[2 * nk * hk :].reshape(nv, hv)
        inv = one / np.sqrt(_F32(hk)).astype(_F32)
        qn = (q * _rms(q, e / _F32(hk))[:, None]) * inv
        kn = (k * _rms(k, e / _F32(hk))[:, None]) * inv
        xa = alpha[t] + dt_bias
        with np.errstate(over="ignore"):
            sp = np.where(
                xa > 20, xa, np.log((one + np.exp(xa.astype(_F64)).astype(_F32)).astype(_F64)).astype(_F32)
            )
            bt = one / (one + np.exp(-beta[t].astype(_F64)).astype(_F32))
        eg = np.exp((sp * a).astype(_F64)).astype(_F32)
        core = np.zeros((nv, hv), _F32)
        for h in range(nv):
            m = m_all[h]
            m *= eg[h]
            kh, qh = kn[h % nk], qn[h % nk]
            sk = _dots(m, kh)
            d = (v[h] - sk) * bt[h]
            m += kh[None, :] * d[:, None]
            core[h] = _dots(m, qh) * (one / np.sqrt(_F32(hv)).astype(_F32))
        g = np.stack([silu(z[t, h * hv : (h + 1) * hv]) for h in range(nv)])
        out[t] = (((core * _rms(core, e)[:, None]) * norm) * g).reshape(-1)
    return out
