"""qwen2: llama's block with biases on Q, K and V and NEOX-style RoPE (llama.cpp's models/qwen2.cpp)."""

from __future__ import annotations

from .. import ops
from .base import DecoderModel, register

__all__ = ["Qwen2"]


@register("qwen2")
class Qwen2(DecoderModel):
    """Biases are picked up from attn_{q,k,v}.bias by the base loader."""

    rope_mode = ops.ROPE_NEOX
