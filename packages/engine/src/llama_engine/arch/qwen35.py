"""qwen35 / qwen35moe (Qwen3.5): gated delta-net layers mixed with gated full-attention layers (llama.cpp's
models/qwen35.cpp and qwen35moe.cpp).

A layer is recurrent (``layers.DeltaNet``) unless ``attention.recurrent_layers`` says otherwise, or, without
that array, every ``full_attention_interval``-th layer (default 4) attends. The attention layers' ``attn_q``
gives, per head, the query and a gate of head_dim each; q and k take per-head RMS norms and M-RoPE
(``rope.dimension_sections``, interleaved: a text token's position in the t, h and w sections, 0 in the
fourth) over ``rope.dimension_count`` dimensions, and the attention output is multiplied by sigmoid(gate)
before ``attn_output``. Both kinds sit between ``attn_norm`` and ``post_attention_norm`` (the FFN's input
norm); the FFN is dense SwiGLU (qwen35) or a softmax-routed mixture of experts with a sigmoid-gated shared
expert (qwen35moe). The memory is the attention layers' KV cache and the delta-net layers' per-sequence
conv and delta states (llama.cpp's hybrid memory).
"""

from __future__ import annotations

import dataclasses
import math
from functools import cached_property
from typing import Any

import numba
import numpy as np

from .. import ops
from ..batch import Batch
from ..kv_cache import KVCache, Placement
from ..layers import FFN, Gating, MoE, MoEConfig
from ..layers.delta_net import DeltaNet, DeltaNetBuffers, DeltaNetShape
from .base import DecoderModel, LayerWeights, _fresh, _vec, register
from .workspace import Workspace

__all__ = ["Qwen35", "Qwen35Moe"]


@register("qwen35")
class Qwen35(DecoderModel):
    rope_mode = ops.ROPE_NEOX
    # the attention's scratch, sized by ``workspace``: the query-and-gate product and the gate
    _qg = _gate = np.zeros((0, 0), np.float32)

    @cached_property
    def recurrent_layers(self) -> list[int]:
        """The delta-net layers (llama.cpp's is_recr)."""
        md, a, n = self._gguf.metadata, self.header.architecture + ".", self.header.block_count
        flags = md.get(a + "attention.recurrent_layers")
        if flags is not None:
            return [il for il in range(n) if bool(flags[il])]
        interval = int(md.get(a + "full_attention_interval", 4))
        return [il for il in range(n) if (il + 1) % interval != 0]

    @cached_property
    def delta_shape(self) -> DeltaNetShape:
        md, a = self._gguf.metadata, self.header.architecture + "."
        try:
            inner, hk = int(md[a + "ssm.inner_size"]), int(md[a + "ssm.state_size"])
            nk, nv = int(md[a + "ssm.group_count"]), int(md[a + "ssm.time_step_rank"])
            taps = int(md[a + "ssm.conv_kernel"])
        except KeyError as e:
            raise ValueError(f"{self.header.architecture}: the model lacks {e.args[0]}") from None
        if nv % nk or inner % nv or inner // nv != hk:
            raise ValueError(f"{a}ssm: {nv} value heads of {inner // max(nv, 1)} over {nk} key heads of {hk}")
        return DeltaNetShape(hk, nk, inner // nv, nv, taps)

    def load_layer(self, il: int) -> LayerWeights:
        if il in self.recurrent_layers:  # post_attention_norm: the FFN's input norm (attn_post_norm)
            return self.load_recurrent_layer(
                il, DeltaNet.load(self, il, self.delta_shape), "post_attention_norm.weight"
            )
        p = f"blk.{il}."
        post = self.vec(p + "post_attention_norm.weight")
        lw = super().load_layer(il)
        c = self.config
        q = lw.wqkv.rows - 2 * c.n_head_kv * c.head_dim if lw.wqkv is not None else lw.wq.rows  # type: ignore[union-attr]
        if q != 2 * c.n_head * c.head_dim:
            raise ValueError(
                f"layer {il}: attn_q has {q} rows, expected query and gate ({2 * c.n_head * c.head_dim})"
            )
        return dataclasses.replace(lw, ffn_norm=post, post_attn_norm=None)

    # -- M-RoPE ------------------------------------------------------------------------------------------

    @cached_property
    def _still_pairs(self) -> np.ndarray:
        """The rotated pairs that M-RoPE gives a text token's fourth position (0): no rotation."""
        md, a = self._gguf.metadata, self.header.architecture + "."
        s = [int(v) for v in md.get(a + "rope.dimension_sections", [])][:4]
        s += [0] * (4 - len(s))
        total = sum(s)
        if total == 0:
            return np.zeros(0, np.int64)
        still = []
        for i in range(self.config.rope_dims // 2):
            sector = i % total
            if sector >= 3 * s[sector % 3]:  # past its interleaved t / h / w section: the fourth's
                still.append(i)
        return np.array(still, np.int64)

    def rope_cache(self, il: int, n_pos: int) -> np.ndarray:
        table = super().rope_cache(il, n_pos)
        still = self._still_pairs
        if len(still) and table[-1, still[0], 1] != table[0, still[0], 1]:
            table[:, still] = table[0, still]  # theta of position 0 (ggml_mrope_cache_init's theta_e)
        return table

    # -- memory and buffers ------------------------------------------------------------------------------

    state_layout = "delta state [head, key, value]"  # ggml keeps [head, value, key] (layers.delta_net)

    def recurrent_rows(self) -> tuple[int, int]:
        """The delta-net layers' conv and delta state widths."""
        s = self.delta_shape
        return s.conv_state, s.ssm_state

    def mixer_buffers(self, n_batch: int) -> DeltaNetBuffers:
        return DeltaNetBuffers(n_batch, self.delta_shape)

    def workspace(self, n_batch: int) -> Workspace:
        ws = super().workspace(n_batch)
        if len(self._gate) < ws.n_batch:
            c = self.config
            q, kv = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
            self._qg = np.zeros((ws.n_batch, 2 * q + 2 * kv), np.float32)  # [q, gate] per head | k | v
            self._gate = np.zeros((ws.n_batch, q), np.float32)
        return ws

    # -- forward -----------------------------------------------------------------------------------------

    def attention(self, il: int, ws: Workspace, batch: Batch, kv: KVCache, placed: Placement) -> None:
        """Gated attention from ``ws.h`` to ``ws.o``: the query-and-gate product split per head, attention
        over q, k, v, its output times sigmoid(gate), then ``attn_output``."""
        lw, c = self.layers[il], self.config
        n = batch.n
        rows = ws.rows(n)
        h = _fresh(ws.h, n)
        qg = self._qg[:n]
        q2, kvd = 2 * c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        if lw.wqkv is not None:
            lw.wqkv.matmul(h, out=qg)
        else:
            assert lw.wq is not None and lw.wk is not None and lw.wv is not None
            lw.wq.matmul(h, out=qg[:, :q2])
            lw.wk.matmul(h, out=qg[:, q2 : q2 + kvd])
            lw.wv.matmul(h, out=qg[:, q2 + kvd :])
        split_gated(rows.qkv, self._gate, qg, n, c.n_head, c.head_dim)
        pi = kv.pool_index(il)
        pool, ranges = kv.cell_pool(il), placed.ranges[pi]
        kc, vc = pool.kernel_kv[il]
        attend: Any = ops.attend
        typed: tuple[Any, ...] = ()
        if pool.typed_attention:
            attend, typed = ops.attend_typed, (*pool.attention_kinds, pool.store(il))
        attend(
            ws.attn.x,
            ws.qkv,
            ws.q,
            _vec(lw.bq),
            _vec(lw.bk),
            _vec(lw.bv),
            _vec(lw.q_norm),
            _vec(lw.k_norm),
            np.float32(c.rms_eps),
            batch.pos,
            self.rope_cache(il, placed.n_pos),
            kc,
            vc,
            placed.cells[pi],
            ranges.cells,
            ranges.lo,
            ranges.hi,
            n,
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            self.rope_dims(il),
            self.rope_mode,
            *self._scales,
            self._tile_cols,
            _vec(lw.sinks),
            *typed,
        )
        sigmoid_mul(ws.attn.x, self._gate, n, c.n_head * c.head_dim)
        assert lw.wo is not None
        lw.wo.matmul(_fresh(ws.attn, n), out=rows.o)


@register("qwen35moe")
class Qwen35Moe(Qwen35):
    """qwen35 with ``MoE`` FFNs (build_moe_ffn: softmax gating, norm_w, expert_weights_scale) and the
    shared expert ``ffn_*_shexp`` gated by sigmoid(``ffn_gate_inp_shexp``)."""

    @cached_property
    def moe(self) -> MoEConfig:
        scale = float(self._gguf.metadata.get(self.header.architecture + ".expert_weights_scale", 0.0))
        return MoEConfig.from_header(
            self.header, gating=Gating.SOFTMAX, norm_weights=True, weights_scale=scale
        )

    def load_ffn(self, il: int) -> FFN:
        return MoE.load(self, il, self.moe)


@numba.njit(cache=True, nogil=True)
def split_gated(qkv, gate, qg, n, n_head, hd):  # type: ignore[no-untyped-def]
    """qkv[t] = q | k | v and gate[t] from qg[t] = (q_h | gate_h per head) | k | v, t < n."""
    q = n_head * hd
    rest = qg.shape[1] - 2 * q
    for t in range(n):
        for hh in range(n_head):
            for i in range(hd):
                qkv[t, hh * hd + i] = qg[t, 2 * hh * hd + i]
                gate[t, hh * hd + i] = qg[t, (2 * hh + 1) * hd + i]
        for i in range(rest):
            qkv[t, q + i] = qg[t, 2 * q + i]


@numba.njit(cache=True, nogil=True)
def sigmoid_mul(x, gate, n, d):  # type: ignore[no-untyped-def]
    """x[t, :d] *= 1 / (1 + expf(-gate[t, :d])) (ggml_sigmoid, libm's expf, then ggml_mul), t < n."""
    one = np.float32(1.0)
    for t in range(n):
        for i in range(d):
            x[t, i] = x[t, i] * (one / (one + np.float32(math.exp(-gate[t, i]))))
