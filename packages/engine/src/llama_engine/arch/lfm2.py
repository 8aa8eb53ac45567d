"""lfm2 (LiquidAI LFM2): short-convolution layers mixed with attention layers, a dense SwiGLU FFN in
every layer (llama.cpp's models/lfm2.cpp).

A layer whose ``attention.head_count_kv`` entry is 0 is a short convolution (``layers.ShortConv``, its
``shortconv.l_cache`` taps), the others attend with per-head Q/K RMS norms and NEOX RoPE. Both kinds sit
between the ``attn_norm`` (llama.cpp's operator_norm) and the FFN's residual, as llama's blocks do. The
final norm is stored as ``token_embd_norm``. The memory is the attention layers' KV cache and the
convolutions' per-sequence state (llama.cpp's hybrid memory).
"""

from __future__ import annotations

import dataclasses

from gguf_io import ModelHeader

from .. import ops
from ..kv_cache import KVCache
from ..layers import DenseFFN, ShortConv
from ..memory import RecurrentPool
from .base import DecoderModel, LayerWeights, ModelConfig, register

__all__ = ["Lfm2"]


@register("lfm2")
class Lfm2(DecoderModel):
    rope_mode = ops.ROPE_NEOX
    output_norm_name = "token_embd_norm.weight"

    @classmethod
    def make_config(cls, h: ModelHeader) -> ModelConfig:
        kv = h.head_count_kv
        per_layer = kv if isinstance(kv, tuple) else (kv,) * h.block_count
        attn = {n for n in per_layer if n > 0}
        if len(attn) != 1:
            raise ValueError(f"lfm2: attention layers with head_count_kv {sorted(attn)}, expected one value")
        h_uniform = dataclasses.replace(h, head_count_kv=attn.pop())
        return super().make_config(h_uniform)

    @property
    def recurrent_layers(self) -> list[int]:
        """The short-convolution layers (head_count_kv 0)."""
        kv = self.header.head_count_kv
        return [il for il in range(self.config.n_layer) if isinstance(kv, tuple) and kv[il] == 0]

    def load_layer(self, il: int) -> LayerWeights:
        if il not in self.recurrent_layers:
            return super().load_layer(il)
        p = f"blk.{il}."
        return LayerWeights(
            attn_norm=self.vec(p + "attn_norm.weight"),
            wq=None,
            wk=None,
            wv=None,
            wqkv=None,
            wo=None,
            ffn_norm=self.vec(p + "ffn_norm.weight"),
            ffn=DenseFFN.load(self, il, self.activation),
            mixer=ShortConv.load(self, il),
        )

    def make_kv_cache(
        self,
        n_ctx: int,
        n_seq_max: int = 1,
        n_ubatch: int = 512,
        swa_full: bool = False,
        type_k: str = "f16",
        type_v: str = "f16",
        flash_attn: bool = False,
    ) -> KVCache:
        c = self.config
        self.workspace(n_ubatch)
        conv = self.recurrent_layers
        d_conv = {lw.mixer.d_conv for il in conv if (lw := self.layers[il]).mixer is not None}
        state = RecurrentPool(n_seq_max, conv, c.n_embd * max(d_conv, default=0))
        attn = [il for il in range(c.n_layer) if il not in conv]
        return KVCache(
            n_ctx,
            c.n_layer,
            c.n_head_kv * c.head_dim,
            n_seq_max=n_seq_max,
            n_ubatch=n_ubatch,
            type_k=type_k,
            type_v=type_v,
            flash_attn=flash_attn,
            head_dim=c.head_dim,
            layers=attn,
            recurrent=state,
        )
