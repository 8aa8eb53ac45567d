"""phi3: fused QKV projection, fused gate+up FFN, NEOX RoPE (llama.cpp's models/phi3.cpp).

Q is scaled by 1/sqrt(head_dim) before attention and the KQ scale is 1, as in llama.cpp's graph.
"""

from __future__ import annotations

from .. import ops
from .base import DecoderModel, register

__all__ = ["Phi3"]


@register("phi3")
class Phi3(DecoderModel):
    """attn_qkv.weight is split after the product; ffn_up.weight holds [gate; up] (no ffn_gate)."""

    rope_mode = ops.ROPE_NEOX

    def q_scale(self) -> float:
        return self.config.attn_scale

    def kq_scale(self) -> float:
        return 1.0
