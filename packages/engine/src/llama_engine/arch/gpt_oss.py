"""gpt-oss: OpenAI's open-weight mixture of experts (llama.cpp's models/openai-moe.cpp, ``gpt-oss``).

Attention with Q/K/V/O biases and a learned sink per head (``attn_sinks``: a logit in each head's softmax
denominator that no value follows), NEOX RoPE with YaRN from the rope scaling keys, scaled by
1/sqrt(n_rot); even layers attend within ``gpt-oss.attention.sliding_window`` tokens, odd layers to the
whole context (llama.cpp's pattern 2; ``attention.sliding_window_pattern`` overrides it), and both kinds
rotate with the same base and YaRN scaling (``rope.freq_base_swa`` when the file sets it). The FFN norm is
the file's ``post_attention_norm``. Every layer's FFN is ``MoE`` with the router's and the experts' biases,
the chosen experts' router logits softmaxed into their weights (SOFTMAX_WEIGHT, not normalised; llama.cpp
reads no ``expert_weights_scale`` here) and the swiglu_oai activation (alpha 1.702, limit 7).
"""

from __future__ import annotations

import dataclasses
from functools import cached_property

import numpy as np

from gguf_io import GGUFFile, ModelHeader
from llama_quant.cpu import KernelSet

from .. import ops
from ..layers import FFN, Gating, MoE, MoEConfig
from .base import DecoderModel, LayerWeights, ModelConfig, register

__all__ = ["GptOss"]

_SWA_PATTERN = 2  # llama.cpp: load_swa_pattern(ml, 2): layer il is SWA when il % 2 < 1


@register("gpt-oss")
class GptOss(DecoderModel):
    rope_mode = ops.ROPE_NEOX
    swa_rope_scaled = True  # rope_freq_scale_train_swa = rope_freq_scale_train

    def __init__(
        self, gguf: GGUFFile, kernels: KernelSet | str | None = None, exact_floats: bool | None = None
    ) -> None:
        super().__init__(gguf, kernels, exact_floats)
        pattern = gguf.metadata.get("gpt-oss.attention.sliding_window_pattern")
        if pattern is not None and self.config.swa_window:
            swa = frozenset(il for il in range(self.config.n_layer) if _is_swa(pattern, il))
            self.config = dataclasses.replace(self.config, swa_layers=swa)

    @classmethod
    def make_config(cls, h: ModelHeader) -> ModelConfig:
        c = super().make_config(h)
        window = h.sliding_window or None
        swa = frozenset(il for il in range(c.n_layer) if _is_swa(_SWA_PATTERN, il)) if window else frozenset()
        # 1.0f/sqrtf(float(n_rot)), in float as the graph computes it
        scale = np.float32(1.0) / np.sqrt(np.float32(c.rope_dims))
        return dataclasses.replace(
            c,
            swa_window=window,
            swa_layers=swa,
            rope_base_swa=h.rope_freq_base_swa or c.rope_base,
            attn_scale=float(scale),
        )

    def load_layer(self, il: int) -> LayerWeights:
        lw = super().load_layer(il)
        if lw.sinks is None:
            raise ValueError(f"layer {il} lacks attn_sinks.weight")
        # openai-moe.cpp: attn_post_norm normalises the FFN's input (the residual after attention)
        lw.ffn_norm, lw.post_attn_norm = lw.post_attn_norm, None
        if lw.ffn_norm is None:
            raise ValueError(f"layer {il} lacks post_attention_norm.weight")
        return lw

    @cached_property
    def moe(self) -> MoEConfig:
        return MoEConfig.from_header(self.header, gating=Gating.SOFTMAX_WEIGHT, activation="swiglu_oai")

    def load_ffn(self, il: int) -> FFN:
        return MoE.load(self, il, self.moe)


def _is_swa(pattern: object, il: int) -> bool:
    """llama.cpp's load_swa_pattern: a per-layer array (``attention.sliding_window_pattern``) says it
    for each layer; an integer n makes layer il SWA when il % n < n - 1 (n = 0: every layer)."""
    if isinstance(pattern, (list, tuple, np.ndarray)):
        return bool(pattern[il])
    n = int(pattern)  # type: ignore[call-overload]
    return n == 0 or il % n < n - 1
