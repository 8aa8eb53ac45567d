"""gemma3: sliding-window attention, per-head Q/K norms, post-attention and post-FFN norms, GeGLU,
embeddings scaled by sqrt(n_embd), output tied to the embeddings (llama.cpp's models/gemma3.cpp).

Five of every six layers attend within a sliding window (`sliding_window` tokens) and use RoPE base
10,000 (`rope.freq_base_swa` when the file sets it); every sixth layer is global with `rope.freq_base`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gguf_io import ModelHeader

from .. import ops
from .base import DecoderModel, ModelConfig, register

__all__ = ["Gemma3"]

_SWA_PATTERN = 6  # llama.cpp: set_swa_pattern(6): layer il is SWA when il % 6 < 5


@register("gemma3")
class Gemma3(DecoderModel):
    rope_mode = ops.ROPE_NEOX
    activation = "gelu"

    @classmethod
    def make_config(cls, h: ModelHeader) -> ModelConfig:
        c = super().make_config(h)
        window = h.sliding_window or None
        swa = (
            frozenset(il for il in range(c.n_layer) if il % _SWA_PATTERN < _SWA_PATTERN - 1)
            if window
            else frozenset()
        )
        # llama.cpp: 1/sqrt(head_dim), except the 27B model (62 layers) which uses 1/sqrt(n_embd / n_head).
        head = c.n_embd // c.n_head if c.n_layer == 62 else c.head_dim
        return dataclasses.replace(
            c,
            swa_window=window,
            swa_layers=swa,
            attn_scale=1.0 / float(np.sqrt(np.float32(head))),
            embed_scale=float(np.sqrt(np.float32(c.n_embd))),
        )

    def q_scale(self) -> float:
        return self.config.attn_scale

    def kq_scale(self) -> float:
        return 1.0

    def finish_logits(self, logits: np.ndarray) -> None:
        """Final logit soft-capping, in place: tanh(logits / cap) * cap."""
        cap = self.header.final_logit_softcapping
        if cap:
            c = np.float32(cap)
            np.divide(logits, c, out=logits)
            np.tanh(logits, out=logits)
            np.multiply(logits, c, out=logits)
