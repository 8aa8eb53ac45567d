"""smollm3: llama's block where every fourth layer has no position encoding (NoPE), llama.cpp's
models/smollm3.cpp.

Layer ``il`` rotates Q and K unless ``(il + 1) % 4 == 0``. llama.cpp fixes the step at 4
(``n_no_rope_layer_step``) and does not read the converter's ``smollm3.no_rope_layer_interval`` or
``no_rope_layers``; neither does this module, so both give the same numbers. A context shift rotates the
cached keys of every layer, NoPE layers included, as llama.cpp's K-shift does.
"""

from __future__ import annotations

from .base import DecoderModel, register

__all__ = ["SmolLM3"]

_NO_ROPE_STEP = 4  # llama.cpp's hparams.n_no_rope_layer_step for smollm3


@register("smollm3")
class SmolLM3(DecoderModel):
    """Normal (adjacent-pair) RoPE on three layers of four, none on the fourth."""

    def rope_dims(self, il: int) -> int:
        return 0 if (il + 1) % _NO_ROPE_STEP == 0 else self.config.rope_dims
