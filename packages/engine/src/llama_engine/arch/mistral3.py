"""mistral3: the Mistral 3 / Ministral 3 text decoder, llama's block (normal RoPE, optional rope_freqs,
YaRN from the rope scaling keys, an optional attention output bias), with a mixture of experts as the FFN
when the file has ``mistral3.expert_count`` (llama.cpp's models/mistral3.cpp: softmax gating, the chosen
weights normalised; llama.cpp does not read ``expert_weights_scale`` for this architecture).

Not implemented, so a file that has them is refused: Llama 4-style attention temperature scaling
(``mistral3.attention.temperature_scale``: Q multiplied by a factor growing with the position) and the
dense FFN's optional biases (``ffn_{gate,up,down}.bias``).
"""

from __future__ import annotations

from functools import cached_property

from ..layers import FFN, DenseFFN, Gating, MoE, MoEConfig
from .base import DecoderModel, register

__all__ = ["Mistral3"]


@register("mistral3")
class Mistral3(DecoderModel):
    """Dense layers as llama's; MoE layers where the file has experts."""

    def load_ffn(self, il: int) -> FFN:
        temp = self._gguf.metadata.get("mistral3.attention.temperature_scale")
        if temp:
            raise ValueError(
                f"mistral3.attention.temperature_scale = {temp}: attention temperature scaling is not supported"
            )
        biases = [n for n in ("ffn_gate", "ffn_up", "ffn_down") if self.has(f"blk.{il}.{n}.bias")]
        if biases:
            raise ValueError(f"layer {il} has FFN biases ({', '.join(biases)}), which are not supported")
        if self.moe is None:
            return DenseFFN.load(self, il, self.activation)
        return MoE.load(self, il, self.moe)

    @cached_property
    def moe(self) -> MoEConfig | None:
        if not self.header.expert_count:
            return None
        return MoEConfig.from_header(self.header, gating=Gating.SOFTMAX, norm_weights=True)
