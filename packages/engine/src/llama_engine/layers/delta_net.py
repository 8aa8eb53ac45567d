"""The gated delta-net layer kind: qwen35's linear-attention block (llama.cpp's build_layer_attn_linear with
its conv state through build_rs, ggml_ssm_conv and the fused ggml_gated_delta_net).

From the normed input h [n, n_embd]: ``attn_qkv`` gives the mixed q | k | v (conv_dim = 2 * n_k_heads *
head_k_dim + n_v_heads * head_v_dim), ``attn_gate`` the gate z [n_v_heads * head_v_dim], ``ssm_beta`` and
``ssm_alpha`` one value per value head. The mixed q | k | v runs through a causal depthwise convolution of
``ssm.conv_kernel`` taps (its first inputs the sequence's conv state) and SiLU; q and k are L2-normalised
per head. Per value head (q and k of head ``h % n_k_heads``), with g = softplus(alpha + ssm_dt) * ssm_a and
beta = sigmoid(beta), the state S [head_k_dim, head_v_dim] absorbs each token in turn:

    S *= exp(g);  d = (v - S^T k) * beta;  S += k d^T;  o = S^T q / sqrt(head_v_dim)

``o`` is RMS-normed per head (``ssm_norm``), gated by silu(z) and projected back by ``ssm_out``. The conv
state [conv_dim, taps - 1] and the delta state [n_v_heads, head_k_dim, head_v_dim] (S itself; ggml keeps its
transpose, whose rows are the sums' operands: here the sums of all value rows advance side by side over the
key index, each in ggml's order, on whole vectors) of each sequence live in the model memory's
``RecurrentPool`` (its conv and SSM slots).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from llama_quant.kernels import Activations, ExactMatrix

from ..ops.expf import expf_sse2

if TYPE_CHECKING:
    from ..arch.base import DecoderModel
    from ..arch.workspace import Workspace
    from ..batch import Batch
    from ..kv_cache import KVCache, Placement

__all__ = ["DeltaNet", "DeltaNetBuffers", "DeltaNetShape", "delta_net"]


@dataclass(frozen=True, slots=True)
class DeltaNetShape:
    """The delta-net's sizes (llama.cpp's ssm.* hyperparameters): ``state_size`` is head_k_dim,
    ``group_count`` the key heads, ``time_step_rank`` the value heads, ``inner_size`` their width."""

    head_k_dim: int
    n_k_heads: int
    head_v_dim: int
    n_v_heads: int
    n_taps: int  # ssm.conv_kernel

    @property
    def conv_dim(self) -> int:
        return 2 * self.n_k_heads * self.head_k_dim + self.n_v_heads * self.head_v_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_v_dim

    @property
    def conv_state(self) -> int:
        """A sequence's conv state: the last taps - 1 inputs of every channel."""
        return self.conv_dim * (self.n_taps - 1)

    @property
    def ssm_state(self) -> int:
        """A sequence's delta state: one [head_k_dim, head_v_dim] matrix per value head."""
        return self.n_v_heads * self.head_v_dim * self.head_k_dim


class DeltaNetBuffers:
    """The delta-net layers' scratch for up to ``n_batch`` tokens (shared by the layers)."""

    __slots__ = ("alpha", "beta", "core", "mixed", "n_batch", "qkv", "y", "z")

    def __init__(self, n_batch: int, shape: DeltaNetShape) -> None:
        f32 = np.float32
        self.n_batch = n_batch
        self.qkv = np.zeros((n_batch, shape.conv_dim), f32)  # attn_qkv's product
        self.z = np.zeros((n_batch, shape.value_dim), f32)  # attn_gate's product
        self.beta = np.zeros((n_batch, shape.n_v_heads), f32)
        self.alpha = np.zeros((n_batch, shape.n_v_heads), f32)
        self.y = Activations(shape.value_dim, n_batch)  # the gated, normed output: ssm_out's input
        # each token's convolved q | k | v and normed q | k, and the heads' delta-rule outputs
        nk = shape.n_k_heads * shape.head_k_dim
        self.mixed = np.zeros((n_batch, shape.conv_dim + 2 * nk), f32)
        self.core = np.zeros((n_batch, shape.value_dim), f32)


@dataclass(slots=True)
class DeltaNet:
    """One layer's ``attn_qkv``, ``attn_gate``, ``ssm_{conv1d, dt, a, beta, alpha, norm, out}``."""

    shape: DeltaNetShape
    wqkv: ExactMatrix  # [conv_dim, n_embd]
    wgate: ExactMatrix  # [value_dim, n_embd]: z
    wbeta: ExactMatrix  # [n_v_heads, n_embd]
    walpha: ExactMatrix  # [n_v_heads, n_embd]
    conv: np.ndarray  # float32 [conv_dim, taps]: each channel's taps, oldest input first
    dt_bias: np.ndarray  # [n_v_heads]
    a: np.ndarray  # [n_v_heads]: -exp(A_log), as the converter stores it
    norm: np.ndarray  # [head_v_dim]
    out: ExactMatrix  # [n_embd, value_dim]

    @classmethod
    def load(cls, model: DecoderModel, il: int, shape: DeltaNetShape) -> DeltaNet:
        p = f"blk.{il}."
        mats = {
            n: model.matrix(p + n + ".weight") for n in ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha")
        }
        out = model.matrix(p + "ssm_out.weight")
        missing = [n for n, m in mats.items() if m is None] + ([] if out is not None else ["ssm_out"])
        if missing:
            raise ValueError(f"layer {il} lacks {', '.join(missing)} weights")
        wqkv, wgate, wbeta, walpha = mats.values()
        assert wqkv is not None and wgate is not None and wbeta is not None and walpha is not None
        assert out is not None
        for name, m, rows in (
            ("attn_qkv", wqkv, shape.conv_dim),
            ("attn_gate", wgate, shape.value_dim),
            ("ssm_beta", wbeta, shape.n_v_heads),
            ("ssm_alpha", walpha, shape.n_v_heads),
        ):
            if m.rows != rows:
                raise ValueError(f"layer {il}: {name} has {m.rows} rows, expected {rows}")
        conv = model.vec(p + "ssm_conv1d.weight").reshape(shape.conv_dim, -1)
        if conv.shape[1] != shape.n_taps:
            raise ValueError(f"layer {il}: ssm_conv1d has {conv.shape[1]} taps, expected {shape.n_taps}")
        return cls(
            shape,
            wqkv,
            wgate,
            wbeta,
            walpha,
            conv,
            model.vec(p + "ssm_dt.bias"),
            model.vec(p + "ssm_a"),
            model.vec(p + "ssm_norm.weight"),
            out,
        )

    @property
    def d_conv(self) -> int:
        """The inputs a sequence's conv state keeps per channel: the taps before the current token's."""
        return self.shape.n_taps - 1

    def forward(
        self, model: DecoderModel, il: int, ws: Workspace, batch: Batch, kv: KVCache, placed: Placement
    ) -> None:
        """The block from ``ws.h`` (normed, ``batch.n`` rows) to ``ws.o``, each token's sequence states
        read and advanced in batch order."""
        n, s = batch.n, self.shape
        b = ws.mixer
        assert isinstance(b, DeltaNetBuffers)
        pi = kv.pool_index(il)
        pool = kv.pools[pi]
        ws.h.rows(n)
        self.wqkv.matmul(ws.h, out=b.qkv[:n])
        self.wgate.matmul(ws.h, out=b.z[:n])
        self.wbeta.matmul(ws.h, out=b.beta[:n])
        self.walpha.matmul(ws.h, out=b.alpha[:n])
        delta_net(
            b.y.x,
            b.qkv,
            b.z,
            b.beta,
            b.alpha,
            pool.k[il],
            pool.v[il],
            self.conv,
            self.dt_bias,
            self.a,
            self.norm,
            placed.cells[pi],
            n,
            s.head_k_dim,
            s.n_k_heads,
            s.head_v_dim,
            s.n_v_heads,
            s.n_taps,
            np.float32(model.config.rms_eps),
            b.mixed,
            b.core,
        )
        b.y.rows(n)
        self.out.matmul(b.y, out=ws.o[:n])


@numba.njit(cache=True, nogil=True, inline="always")
def _silu(y, x, d):  # type: ignore[no-untyped-def]
    """y[:d] = silu(x[:d]) as ggml_vec_silu_f32 (SSE2): ggml_v_expf on groups of four, libm's expf after."""
    one = np.float32(1.0)
    simd = d - d % 4
    for i in range(simd):
        y[i] = x[i] / (one + expf_sse2(-x[i]))
    for i in range(simd, d):
        y[i] = x[i] / (one + np.float32(math.exp(-x[i])))


@numba.njit(cache=True, nogil=True, inline="always")
def _rms_scale(x, d, eps):  # type: ignore[no-untyped-def]
    """ggml_rms_norm's factor for x[:d]: squares in float summed in double, 1 / sqrtf(mean + eps)."""
    acc = 0.0
    for i in range(d):
        acc += np.float64(x[i] * x[i])
    return np.float32(1.0) / np.float32(math.sqrt(np.float32(acc / d) + eps))


@numba.njit(cache=True, nogil=True, parallel=True)
def delta_net(  # type: ignore[no-untyped-def]
    y,
    qkv,
    z,
    beta,
    alpha,
    conv_state,
    ssm_state,
    w,
    dt_bias,
    a,
    norm,
    rows,
    n,
    hk,
    nk,
    hv,
    nv,
    taps,
    eps,
    mixed,
    core,
):
    """y[t] = ssm_norm(o) * silu(z) for each token t of state row rows[t], both states advanced.

    y, z: [n, nv * hv]; qkv: [n, conv_dim] (q | k | v); beta, alpha: [n, nv]; conv_state: [n_seq,
    conv_dim * (taps - 1)], each channel's last inputs oldest first; ssm_state: [n_seq, nv * hk * hv], per
    head the state S [hk, hv] row-major (ggml keeps its transpose; here a row of S is a vector of the
    value dimension, so every step runs on whole vectors); w: [conv_dim, taps]; mixed: [>= n, conv_dim + 2
    * nk * hk] and core [>= n, nv * hv] scratch. Every sum runs in ggml's order: the taps in float from the oldest
    input (ggml_ssm_conv), the state's dot products in double (ggml_vec_dot_f32), the norms' squares in
    double.

    Four parallel passes, each over what is independent in it: the convolution per channel (its tokens in
    order), the activation and q / k norms per token, the delta rule per value head (its tokens in order,
    each on its own sequence's state), the output norm and gate per token."""
    cd = 2 * nk * hk + nv * hv
    dc = taps - 1
    one = np.float32(1.0)
    for ch in prange(cd):  # the causal convolution, each channel through its tokens in order
        for t in range(n):
            st = conv_state[rows[t]]
            x = qkv[t, ch]
            base = ch * dc
            acc = np.float32(0.0)
            for k in range(dc):
                acc += st[base + k] * w[ch, k]
            acc += x * w[ch, dc]
            for k in range(dc - 1):
                st[base + k] = st[base + k + 1]
            if dc > 0:
                st[base + dc - 1] = x
            mixed[t, ch] = acc
    l2_eps = eps / np.float32(hk)  # build_gdn_l2_norm: rms_norm(x, eps / n) / sqrtf(n)
    inv_sqrt_k = one / np.float32(math.sqrt(np.float32(hk)))
    for t in prange(n):  # SiLU, then q and k L2-normed per key head (after the convolved row)
        conv = mixed[t, :cd]
        _silu(conv, conv, cd)
        qn = mixed[t, cd : cd + nk * hk]
        kn = mixed[t, cd + nk * hk : cd + 2 * nk * hk]
        for h in range(nk):
            q = conv[h * hk : (h + 1) * hk]
            k = conv[(nk + h) * hk : (nk + h + 1) * hk]
            sq = _rms_scale(q, hk, l2_eps)
            sk = _rms_scale(k, hk, l2_eps)
            for i in range(hk):
                qn[h * hk + i] = (q[i] * sq) * inv_sqrt_k
                kn[h * hk + i] = (k[i] * sk) * inv_sqrt_k
    scale = one / np.float32(math.sqrt(np.float32(hv)))
    for h in prange(nv):  # the delta rule, each value head through its tokens in order
        sums = np.empty(hv, np.float64)  # every row's sum, in double as ggml_vec_dot_f32's
        delta = np.empty(hv, np.float32)
        kh = h % nk
        for t in range(n):
            qd = mixed[t, cd + kh * hk : cd + (kh + 1) * hk]
            kd = mixed[t, cd + (nk + kh) * hk : cd + (nk + kh + 1) * hk]
            v = mixed[t, 2 * nk * hk + h * hv : 2 * nk * hk + (h + 1) * hv]
            xa = alpha[t, h] + dt_bias[h]
            sp = xa if xa > np.float32(20.0) else np.float32(math.log(one + np.float32(math.exp(xa))))
            eg = np.float32(math.exp(sp * a[h]))
            bt = one / (one + np.float32(math.exp(-beta[t, h])))
            m = ssm_state[rows[t], h * hk * hv : (h + 1) * hk * hv]  # S[i, j] at i * hv + j
            _delta_rule(m, kd, qd, v, eg, bt, scale, sums, delta, core[t, h * hv : (h + 1) * hv], hk, hv)
    for t in prange(n):  # per head: RMS norm, ssm_norm's weight, silu(z)
        for h in range(nv):
            o = core[t, h * hv : (h + 1) * hv]
            yo = y[t, h * hv : (h + 1) * hv]
            _silu(yo, z[t, h * hv : (h + 1) * hv], hv)  # the gate's rows are one head wide
            sc = _rms_scale(o, hv, eps)
            for j in range(hv):
                yo[j] = ((o[j] * sc) * norm[j]) * yo[j]


@numba.njit(cache=True, nogil=True)
def _delta_rule(m, kd, qd, v, eg, bt, scale, acc, delta, out, hk, hv):  # type: ignore[no-untyped-def]
    """One head's state S (m: [hk * hv], row-major) absorbs a token: S *= eg; delta = (v - S^T k) * bt;
    S += k delta^T; out = S^T q * scale. The sums over i run in order, all rows j side by side: _COLS
    columns at a time with their double sums in registers (``_cols_pass``) where hv allows, else whole rows
    (a function of its own, not inlined: compiled alone, its loops are vectorized)."""
    if hv % _COLS == 0:
        for j0 in range(0, hv, _COLS):
            _cols_pass(m, hk, hv, eg, kd, delta, kd, acc, j0, False)  # type: ignore[call-arg]
    else:
        for j in range(hv):
            acc[j] = 0.0
        for i in range(hk):
            _decay_dot(m[i * hv : (i + 1) * hv], eg, kd[i], acc)
    for j in range(hv):
        delta[j] = (v[j] - np.float32(acc[j])) * bt
    if hv % _COLS == 0:
        for j0 in range(0, hv, _COLS):
            _cols_pass(m, hk, hv, eg, kd, delta, qd, acc, j0, True)  # type: ignore[call-arg]
    else:
        for j in range(hv):
            acc[j] = 0.0
        for i in range(hk):
            _update_dot(m[i * hv : (i + 1) * hv], kd[i], delta, qd[i], acc)
    for j in range(hv):
        out[j] = np.float32(acc[j]) * scale


_COLS = 32  # value columns ``_cols_pass`` takes at once: their 32 double sums in four 512-bit registers


@intrinsic
def _cols_pass(typingctx, m, hk, hv, eg, kd, delta, dot, acc, j0, update):  # type: ignore[no-untyped-def]
    """Columns j0 .. j0 + _COLS of every row i < hk of m (row stride hv), in order of i: decaying (``update``
    a literal False), row *= eg; updating (True), row += kd[i] * delta[j0:]; then acc[j0:] (f64), zeroed
    first, += double(row * dot[i]): ``_decay_dot`` and ``_update_dot`` on a column block, each float
    operation the same, the sums kept in registers over the whole loop instead of in memory."""
    if not isinstance(update, types.BooleanLiteral):
        return None
    grow = update.literal_value
    ip = types.intp
    sig = types.void(m, ip, ip, eg, kd, delta, dot, acc, ip, update)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        m_p, kd_p, dl_p, dot_p, acc_p = (
            context.make_array(signature.args[k])(context, builder, args[k]).data for k in (0, 4, 5, 6, 7)
        )
        hk, hv, eg, j0 = args[1], args[2], args[3], args[8]
        vf, vd = ir.VectorType(ir.FloatType(), _COLS), ir.VectorType(ir.DoubleType(), 8)
        i32 = ir.IntType(32)

        def splat(x):  # type: ignore[no-untyped-def]
            undef = ir.Constant(vf, ir.Undefined)
            one = builder.insert_element(undef, x, ir.Constant(i32, 0))
            return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(i32, _COLS), [0] * _COLS))

        def vec(p, off, ty):  # type: ignore[no-untyped-def]
            return builder.bitcast(builder.gep(p, [off]), ty.as_pointer())

        dl = builder.load(vec(dl_p, j0, vf), align=4) if grow else None
        egv = None if grow else splat(eg)
        sums = [cgutils.alloca_once_value(builder, ir.Constant(vd, None)) for _ in range(_COLS // 8)]
        with cgutils.for_range(builder, hk) as loop:
            i = loop.index
            at = vec(m_p, builder.add(builder.mul(i, hv), j0), vf)
            x = builder.load(at, align=4)
            if grow:
                x = builder.fadd(x, builder.fmul(splat(builder.load(builder.gep(kd_p, [i]))), dl))
            else:
                x = builder.fmul(x, egv)
            builder.store(x, at, align=4)
            prod = builder.fmul(x, splat(builder.load(builder.gep(dot_p, [i]))))
            for b, s in enumerate(sums):
                part = builder.shuffle_vector(
                    prod, prod, ir.Constant(ir.VectorType(i32, 8), list(range(8 * b, 8 * b + 8)))
                )
                builder.store(builder.fadd(builder.load(s), builder.fpext(part, vd)), s)
        for b, s in enumerate(sums):
            builder.store(
                builder.load(s), vec(acc_p, builder.add(j0, ir.Constant(j0.type, 8 * b)), vd), align=8
            )
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _decay_dot(row, eg, ki, acc):  # type: ignore[no-untyped-def]
    """row *= eg; acc += double(row * ki), element by element (a loop LLVM vectorizes: the indices are the
    loop's own)."""
    for j in range(row.shape[0]):
        x = row[j] * eg
        row[j] = x
        acc[j] += np.float64(x * ki)


@numba.njit(cache=True, nogil=True, inline="always")
def _update_dot(row, ki, delta, qi, acc):  # type: ignore[no-untyped-def]
    """row += ki * delta; acc += double(row * qi), element by element."""
    for j in range(row.shape[0]):
        x = row[j] + ki * delta[j]
        row[j] = x
        acc[j] += np.float64(x * qi)
