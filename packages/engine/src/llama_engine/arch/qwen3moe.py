"""qwen3moe: qwen3's attention (per-head Q/K RMS norms, NEOX RoPE) and a mixture of experts as every
layer's FFN (llama.cpp's models/qwen3moe.cpp).

``qwen3moe.expert_count`` experts, ``expert_used_count`` chosen per token by a softmax router, their
weights normalised to sum 1; ``expert_feed_forward_length`` is each expert's width (llama.cpp reads it
from the tensors' shapes too). As in llama.cpp, ``expert_weights_scale`` is not read for this
architecture and no shared expert is loaded.
"""

from __future__ import annotations

from functools import cached_property

from ..layers import FFN, Gating, MoE, MoEConfig
from .base import register
from .qwen3 import Qwen3

__all__ = ["Qwen3Moe"]


@register("qwen3moe")
class Qwen3Moe(Qwen3):
    """Every layer: qwen3's attention block, then ``MoE`` (build_moe_ffn: softmax gating, norm_w)."""

    @cached_property
    def moe(self) -> MoEConfig:
        return MoEConfig.from_header(self.header, gating=Gating.SOFTMAX, norm_weights=True)

    def load_ffn(self, il: int) -> FFN:
        return MoE.load(self, il, self.moe)
