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
from ..layers import ShortConv
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
        return self.load_recurrent_layer(il, ShortConv.load(self, il))

    def recurrent_rows(self) -> tuple[int, int]:
        """Each convolution's last d_conv inputs of n_embd, no SSM state."""
        d_conv = {
            lw.mixer.d_conv for il in self.recurrent_layers if (lw := self.layers[il]).mixer is not None
        }
        return self.config.n_embd * max(d_conv, default=0), 0
