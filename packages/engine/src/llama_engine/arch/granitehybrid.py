"""granitehybrid (IBM Granite 4.0 hybrid): Mamba-2 layers mixed with attention layers, a dense SwiGLU FFN
or a mixture of experts with a shared expert in every layer (llama.cpp's models/granite-hybrid.cpp).

A layer whose ``attention.head_count_kv`` entry is 0 is a Mamba-2 block (``layers.Mamba2``, its shape from
``granitehybrid.ssm.*``); the others attend with normal RoPE, or with none when
``rope.scaling.finetuned`` is false. Granite's multipliers, each skipped when absent or 0:
``embedding_scale`` on the token embeddings, ``attention.scale`` as the KQ scale (else 1 / sqrt(head_dim)),
``residual_scale`` on the mixer's and the FFN's outputs before each residual add, and the logits divided
by ``logit_scale``. With ``expert_count`` the FFN is build_moe_ffn (softmax gating, weights normalised)
plus, with ``expert_shared_feed_forward_length``, the shared expert ``ffn_*_shexp`` added ungated. The
memory is the attention layers' KV cache and the Mamba-2 layers' conv and SSM states (llama.cpp's hybrid
memory).
"""

from __future__ import annotations

import dataclasses
from functools import cached_property

import numpy as np

from gguf_io import GGUFFile, ModelHeader
from llama_quant.cpu import KernelSet

from .. import ops
from ..batch import Batch
from ..kv_cache import KVCache, Placement
from ..layers import FFN, DenseFFN, Gating, Mamba2, Mamba2Buffers, Mamba2Shape, MoE, MoEConfig
from .base import DecoderModel, LayerWeights, ModelConfig, register
from .workspace import EMPTY, Workspace

__all__ = ["GraniteHybrid"]


@register("granitehybrid")
class GraniteHybrid(DecoderModel):
    rope_mode = ops.ROPE_NORM

    def __init__(
        self, gguf: GGUFFile, kernels: KernelSet | str | None = None, exact_floats: bool | None = None
    ) -> None:
        meta, a = gguf.metadata, gguf.header.architecture + "."

        def scale(key: str) -> float:
            return float(meta.get(a + key) or 0.0)

        self.residual_scale = np.float32(scale("residual_scale"))
        self.logit_scale = scale("logit_scale")
        self.attention_scale = scale("attention.scale")
        self.use_rope = bool(meta.get(a + "rope.scaling.finetuned", True))  # Granite's switch for RoPE
        kv = gguf.header.head_count_kv
        self._recurrent = [
            il for il in range(gguf.header.block_count) if isinstance(kv, tuple) and kv[il] == 0
        ]
        self.ssm = Mamba2Shape.from_metadata(meta, gguf.header.architecture) if self._recurrent else None
        super().__init__(gguf, kernels, exact_floats)
        if scale("embedding_scale"):
            self.config = dataclasses.replace(self.config, embed_scale=scale("embedding_scale"))

    @classmethod
    def make_config(cls, h: ModelHeader) -> ModelConfig:
        kv = h.head_count_kv
        per_layer = kv if isinstance(kv, tuple) else (kv,) * h.block_count
        heads = h.head_count if isinstance(h.head_count, tuple) else (h.head_count,) * h.block_count
        attn_kv = {n for n in per_layer if n > 0}
        attn_q = {q for q, n in zip(heads, per_layer, strict=True) if n > 0}
        if len(attn_kv) != 1 or len(attn_q) != 1:
            raise ValueError(
                f"granitehybrid: attention layers with head_count {sorted(attn_q)} and head_count_kv "
                f"{sorted(attn_kv)}, expected one value of each"
            )
        return super().make_config(
            dataclasses.replace(h, head_count=attn_q.pop(), head_count_kv=attn_kv.pop())
        )

    @property
    def recurrent_layers(self) -> list[int]:
        """The Mamba-2 layers (head_count_kv 0)."""
        return self._recurrent

    @cached_property
    def moe(self) -> MoEConfig:
        return MoEConfig.from_header(self.header, gating=Gating.SOFTMAX, norm_weights=True)

    def load_ffn(self, il: int) -> FFN:
        p = f"blk.{il}."
        if any(self.has(p + f"ffn_{n}.bias") for n in ("gate", "up", "down")):
            raise ValueError(f"granitehybrid: layer {il}'s FFN biases are not supported")
        if self.header.expert_count:
            return MoE.load(self, il, self.moe)
        return DenseFFN.load(self, il, self.activation)

    def load_layer(self, il: int) -> LayerWeights:
        if il not in self._recurrent:
            return super().load_layer(il)
        assert self.ssm is not None
        return self.load_recurrent_layer(il, Mamba2.load(self, il, self.ssm))

    def kq_scale(self) -> float:
        return self.attention_scale or self.config.attn_scale

    def rope_dims(self, il: int) -> int:
        return self.config.rope_dims if self.use_rope else 0

    def finish_logits(self, logits: np.ndarray) -> None:
        if self.logit_scale:  # ggml_scale by 1.0f / f_logit_scale, the factor rounded to float first
            np.multiply(logits, np.float32(1.0) / np.float32(self.logit_scale), out=logits)

    def mixer_buffers(self, n_batch: int) -> Mamba2Buffers:
        assert self.ssm is not None
        return Mamba2Buffers(n_batch, self.ssm)

    def recurrent_rows(self) -> tuple[int, int] | None:
        """The Mamba-2 layers' conv and SSM state widths; None without Mamba-2 layers."""
        return (self.ssm.r_dim, self.ssm.s_dim) if self.ssm is not None else None

    def block(self, il: int, ws: Workspace, batch: Batch, kv: KVCache, placed: Placement) -> None:
        """build_layer_ffn: the mixer's output (with attn_output's bias) and the FFN's, each times
        ``residual_scale``, added to the residual stream."""
        n, c, lw = batch.n, self.config, self.layers[il]
        eps, d = c.rms_eps, c.n_embd
        o = ws.o[:n]
        if lw.mixer is not None:
            lw.mixer.forward(self, il, ws, batch, kv, placed)
        else:
            self.attention(il, ws, batch, kv, placed)
            if lw.bo is not None:
                np.add(o, lw.bo, out=o)
        if self.residual_scale:
            np.multiply(o, self.residual_scale, out=o)
        assert lw.ffn_norm is not None
        ops.residual_norm(ws.x, ws.o, EMPTY, EMPTY, lw.ffn_norm, ws.h.x, eps, n, d)
        self.ffn(il, ws, n)
        if self.residual_scale:
            np.multiply(o, self.residual_scale, out=o)
        nxt = self.layers[il + 1].attn_norm if il + 1 < c.n_layer else EMPTY
        ops.residual_norm(ws.x, ws.o, EMPTY, EMPTY, nxt, ws.h.x, eps, n, d)
