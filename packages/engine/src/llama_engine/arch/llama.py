"""llama: Llama 2/3, Mistral-style grouped-query attention, SmolLM2 (llama.cpp's models/llama.cpp).

RoPE rotates adjacent pairs: the GGUF converter permutes Q and K weights for ggml's "normal" RoPE.
"""

from __future__ import annotations

from .base import DecoderModel, register

__all__ = ["Llama"]


@register("llama")
class Llama(DecoderModel):
    """The base decoder as is: RMS norm, SwiGLU FFN, optional output head (tied to the embeddings)."""
