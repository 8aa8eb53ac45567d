"""The Mamba-2 layer kind: llama.cpp's build_mamba2_layer (a selective state-space block in attention's
place, its states through build_rs).

From the normed input h [n, n_embd], ``ssm_in`` gives z [d_inner], xBC [d_inner + 2 * n_group * d_state]
and dt [n_head]. xBC runs through a causal depthwise convolution of ``d_conv`` taps per channel
(ggml_ssm_conv: the first ``d_conv - 1`` inputs are the sequence's conv state), plus ``ssm_conv1d.bias``,
then SiLU; it splits into x [n_head, head_dim], B and C [n_group, d_state]. dt plus ``ssm_dt.bias``
goes through softplus, and ggml_ssm_scan advances each head's state [head_dim, d_state] by the scalar
decay exp(softplus(dt) * A) and B * x * softplus(dt), y being the state's dot with C (head h reads group
h / (n_head / n_group)). Then y + x * D, gated by silu(z), RMS-normed per group with ``ssm_norm``, and
``ssm_out`` maps it back to n_embd.

A sequence's conv state [conv_dim, d_conv - 1] (channel-major, llama.cpp's ``{d_conv - 1, conv_dim}``
rows) and SSM state [n_head, head_dim, d_state] (llama.cpp's ``{d_state, head_dim, n_head}``) live in the
model memory's ``RecurrentPool`` (its ``k`` and ``v`` rows). Exact as ggml's portable CPU build: the conv
taps and the scan's dot summed in float in order, the SiLU and SwiGLU through SSE2's ggml_v_expf in groups
of four per row, softplus and the decay through the C library's logf / expf.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numba
import numpy as np

from llama_quant.kernels import Activations, ExactMatrix

from ..ops.expf import expf_sse2
from ..ops.norm import rms_norm_row

if TYPE_CHECKING:
    from ..arch.base import DecoderModel
    from ..arch.workspace import Workspace
    from ..batch import Batch
    from ..kv_cache import KVCache, Placement

__all__ = ["Mamba2", "Mamba2Buffers", "Mamba2Shape", "mamba2_conv", "mamba2_gate_norm", "mamba2_scan"]


@dataclass(frozen=True, slots=True)
class Mamba2Shape:
    """The ``<arch>.ssm.*`` hyperparameters (llama_hparams' ssm_d_conv, ssm_d_inner, ssm_d_state,
    ssm_dt_rank as the head count, ssm_n_group)."""

    d_conv: int
    d_inner: int
    d_state: int
    n_head: int
    n_group: int

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], arch: str) -> Mamba2Shape:
        keys = ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count")
        missing = [k for k in keys if f"{arch}.ssm.{k}" not in meta]
        if missing:
            raise ValueError(f"{arch}: the file lacks " + ", ".join(f"{arch}.ssm.{k}" for k in missing))
        s = cls(*(int(meta[f"{arch}.ssm.{k}"]) for k in keys))
        if s.d_conv < 2 or s.n_head < 1 or s.n_group < 1 or s.d_inner % s.n_head or s.n_head % s.n_group:
            raise ValueError(f"{arch}: unsupported ssm shape {s}")
        return s

    @property
    def head_dim(self) -> int:
        return self.d_inner // self.n_head

    @property
    def conv_dim(self) -> int:
        """The convolved channels: x, B and C."""
        return self.d_inner + 2 * self.n_group * self.d_state

    @property
    def d_in_proj(self) -> int:
        return 2 * self.d_inner + 2 * self.n_group * self.d_state + self.n_head

    @property
    def r_dim(self) -> int:
        """A sequence's conv state (llama.cpp's n_embd_r)."""
        return (self.d_conv - 1) * self.conv_dim

    @property
    def s_dim(self) -> int:
        """A sequence's SSM state (llama.cpp's n_embd_s)."""
        return self.d_state * self.d_inner


class Mamba2Buffers:
    """The Mamba-2 layers' scratch for up to ``n_batch`` tokens (shared by the layers)."""

    __slots__ = ("n_batch", "xbc", "y", "y_in", "zxbcdt")

    def __init__(self, n_batch: int, s: Mamba2Shape) -> None:
        f32 = np.float32
        self.n_batch = n_batch
        self.zxbcdt = np.zeros((n_batch, s.d_in_proj), f32)  # [z | xBC | dt]: ssm_in's product
        self.xbc = np.zeros((n_batch, s.conv_dim), f32)  # silu(conv(xBC) + bias): [x | B | C]
        self.y = np.zeros((n_batch, s.d_inner), f32)  # the scan's output
        self.y_in = Activations(s.d_inner, n_batch)  # the gated, normed y: ssm_out's input


@dataclass(slots=True)
class Mamba2:
    """One layer's ``ssm_{in, conv1d, dt, a, d, norm, out}``."""

    shape: Mamba2Shape
    ssm_in: ExactMatrix  # [d_in_proj, n_embd]
    conv: np.ndarray  # float32 [conv_dim, d_conv]: each channel's taps, oldest input first
    conv_bias: np.ndarray  # float32 [conv_dim] (zeros where the file has none)
    dt_bias: np.ndarray  # float32 [n_head]
    a: np.ndarray  # float32 [n_head]: the (negative) decay rate per head
    d: np.ndarray  # float32 [n_head]: the skip weight per head
    norm: np.ndarray  # float32 [d_inner]: the group RMS norm's weight, group-major
    ssm_out: ExactMatrix  # [n_embd, d_inner]
    eps: float

    @classmethod
    def load(cls, model: DecoderModel, il: int, s: Mamba2Shape) -> Mamba2:
        p = f"blk.{il}."
        ssm_in, ssm_out = model.matrix(p + "ssm_in.weight"), model.matrix(p + "ssm_out.weight")
        if ssm_in is None or ssm_out is None:
            raise ValueError(f"layer {il} lacks ssm_in or ssm_out weights")
        if ssm_in.rows != s.d_in_proj or ssm_out.cols != s.d_inner:
            raise ValueError(f"layer {il}: ssm_in has {ssm_in.rows} rows, expected {s.d_in_proj}")
        conv = model.vec(p + "ssm_conv1d.weight")
        if conv.size != s.conv_dim * s.d_conv:
            raise ValueError(f"layer {il}: ssm_conv1d has {conv.size} taps, expected {s.conv_dim * s.d_conv}")
        bias = model.vec_or_none(p + "ssm_conv1d.bias")
        dt_bias, a, d, norm = (model.vec(p + n) for n in ("ssm_dt.bias", "ssm_a", "ssm_d", "ssm_norm.weight"))
        if [v.size for v in (dt_bias, a, d, norm)] != [s.n_head, s.n_head, s.n_head, s.d_inner]:
            raise ValueError(f"layer {il}: ssm_dt.bias, ssm_a, ssm_d or ssm_norm has the wrong size")
        conv_bias = np.zeros(s.conv_dim, np.float32) if bias is None else bias
        conv = conv.reshape(s.conv_dim, s.d_conv)
        return cls(s, ssm_in, conv, conv_bias, dt_bias, a, d, norm, ssm_out, model.config.rms_eps)

    @property
    def d_conv(self) -> int:
        """The inputs a sequence's conv state keeps: the taps before the current token's."""
        return self.shape.d_conv - 1

    def buffers(self, n_batch: int) -> Mamba2Buffers:
        return Mamba2Buffers(n_batch, self.shape)

    def forward(
        self, model: DecoderModel, il: int, ws: Workspace, batch: Batch, kv: KVCache, placed: Placement
    ) -> None:
        """The block from ``ws.h`` (normed, ``batch.n`` rows) to ``ws.o``, each token's sequence states
        read and advanced in batch order."""
        n, s = batch.n, self.shape
        b = ws.mixer
        assert isinstance(b, Mamba2Buffers)
        pi = kv.pool_index(il)
        pool, rows = kv.pools[pi], placed.cells[pi]
        ws.h.rows(n)
        self.ssm_in.matmul(ws.h, out=b.zxbcdt[:n])
        mamba2_conv(b.xbc, b.zxbcdt, pool.k[il], self.conv, self.conv_bias, rows, n, s.d_inner, s.d_conv)
        mamba2_scan(
            b.y, b.xbc, b.zxbcdt, pool.v[il], self.dt_bias, self.a, rows, n, s.d_inner, s.d_state,
            s.n_head, s.n_group,
        )  # fmt: skip
        mamba2_gate_norm(
            b.y_in.x, b.y, b.xbc, b.zxbcdt, self.d, self.norm, np.float32(self.eps), n, s.d_inner,
            s.n_head, s.n_group,
        )  # fmt: skip
        b.y_in.rows(n)
        self.ssm_out.matmul(b.y_in, out=ws.o[:n])


@numba.njit(cache=True, nogil=True)
def mamba2_conv(xbc, zxbcdt, state, w, bias, rows, n, d_inner, d_conv):  # type: ignore[no-untyped-def]
    """xbc[t] = silu(conv(xBC) + bias) for each token t of state row rows[t], the state advanced by its
    input (ggml_ssm_conv, ggml_add, ggml_silu).

    xbc: [n, c]; zxbcdt: [n, d_in_proj], xBC at columns d_inner .. d_inner + c; state: [n_seq, c * (d_conv -
    1)], each channel's last inputs oldest first; w: [c, d_conv]; bias: [c]. The taps sum in float from the
    oldest input; the SiLU is ggml_vec_silu_f32's: SSE2's ggml_v_silu on groups of four, then the C library's
    expf."""
    c = w.shape[0]
    k = d_conv - 1
    one = np.float32(1.0)
    zero = np.float32(0.0)
    simd = c - c % 4
    for t in range(n):
        st = state[rows[t]]
        for ch in range(c):
            u = zxbcdt[t, d_inner + ch]
            base = ch * k
            acc = np.float32(0.0)
            for j in range(k):
                acc += st[base + j] * w[ch, j]
            acc += u * w[ch, k]
            for j in range(k - 1):
                st[base + j] = st[base + j + 1]
            st[base + k - 1] = u
            v = acc + bias[ch]
            if ch < simd:
                xbc[t, ch] = v / (one + expf_sse2(zero - v))
            else:
                xbc[t, ch] = v / (one + np.float32(math.exp(-v)))


@numba.njit(cache=True, nogil=True)
def _softplus(x):  # type: ignore[no-untyped-def]
    """ggml_compute_softplus_f32: x above 20, else logf(1 + expf(x))."""
    if x > np.float32(20.0):
        return x
    return np.float32(math.log(np.float32(1.0) + np.float32(math.exp(x))))


@numba.njit(cache=True, nogil=True)
def mamba2_scan(y, xbc, zxbcdt, state, dt_bias, a, rows, n, d_inner, d_state, n_head, n_group):  # type: ignore[no-untyped-def]
    """ggml_ssm_scan with a scalar decay per head, token by token: y[t] [d_inner] and each token's state
    row rows[t] advanced in place.

    xbc: [n, d_inner + 2 * n_group * d_state] (x | B | C); zxbcdt: dt at its last n_head columns; state:
    [n_seq, n_head * head_dim * d_state]; dt_bias, a: [n_head]. state = state * dA + B * (x * dt), y the
    float sum of state * C over d_state in order."""
    hd = d_inner // n_head
    heads_per_group = n_head // n_group
    dt0 = zxbcdt.shape[1] - n_head
    b0 = d_inner
    c0 = d_inner + n_group * d_state
    for t in range(n):
        s = state[rows[t]]
        for h in range(n_head):
            sp = _softplus(zxbcdt[t, dt0 + h] + dt_bias[h])
            da = np.float32(math.exp(sp * a[h]))
            g = h // heads_per_group
            for i1 in range(hd):
                ii = i1 + h * hd
                x_dt = xbc[t, ii] * sp
                acc = np.float32(0.0)
                for i0 in range(d_state):
                    si = ii * d_state + i0
                    v = (s[si] * da) + (xbc[t, b0 + g * d_state + i0] * x_dt)
                    acc += v * xbc[t, c0 + g * d_state + i0]
                    s[si] = v
                y[t, ii] = acc


@numba.njit(cache=True, nogil=True)
def mamba2_gate_norm(out, y, xbc, zxbcdt, d, w, eps, n, d_inner, n_head, n_group):  # type: ignore[no-untyped-def]
    """out[t] = rms_norm_groups(silu(z) * (y + x * D)) * w: the D skip (ggml_mul, ggml_add), the SwiGLU of
    z per head row of head_dim (ggml_vec_swiglu_f32: SSE2 groups of four, then the C library's expf), and
    ggml_rms_norm over each group of d_inner / n_group times ``ssm_norm``.

    out, y: [n, d_inner]; xbc: x at its first d_inner columns; zxbcdt: z at its first d_inner columns."""
    hd = d_inner // n_head
    gs = d_inner // n_group
    simd = hd - hd % 4
    one = np.float32(1.0)
    zero = np.float32(0.0)
    for t in range(n):
        o = out[t]
        for h in range(n_head):
            for i1 in range(hd):
                ii = i1 + h * hd
                yy = y[t, ii] + xbc[t, ii] * d[h]
                z = zxbcdt[t, ii]
                if i1 < simd:
                    o[ii] = z / (one + expf_sse2(zero - z)) * yy
                else:
                    o[ii] = z / (one + np.float32(math.exp(-z))) * yy
        for g in range(n_group):
            row = o[g * gs : (g + 1) * gs]
            rms_norm_row(row, row, w[g * gs : (g + 1) * gs], eps, gs)
