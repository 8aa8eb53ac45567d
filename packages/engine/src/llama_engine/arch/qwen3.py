"""qwen3: llama's block with per-head RMS norms on Q and K and NEOX RoPE (llama.cpp's models/qwen3.cpp)."""

from __future__ import annotations

from .. import ops
from .base import DecoderModel, register

__all__ = ["Qwen3"]


@register("qwen3")
class Qwen3(DecoderModel):
    """attn_q_norm / attn_k_norm are applied per head before RoPE by the base attention."""

    rope_mode = ops.ROPE_NEOX
