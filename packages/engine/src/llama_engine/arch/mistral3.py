"""mistral3: the Mistral 3 / Ministral 3 text decoder, llama's block (normal RoPE, optional rope_freqs,
YaRN from the rope scaling keys, an optional attention output bias), with a mixture of experts as the FFN
when the file has ``mistral3.expert_count`` (llama.cpp's models/mistral3.cpp: softmax gating, the chosen
weights normalised; llama.cpp does not read ``expert_weights_scale`` for this architecture).

Attention temperature scaling (Llama 4's, with ``mistral3.attention.temperature_scale``): q, after RoPE,
times ``1 + scale * log(floor(pos / n) + 1)`` for the token at position ``pos``, ``n`` being YaRN's
original context (``rope.scaling.original_context_length``, default the training context), as llama.cpp
computes it (the floor in float, the logarithm in double, the factor rounded to float).

Not implemented, so a file that has them is refused: the dense FFN's optional biases
(``ffn_{gate,up,down}.bias``).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from gguf_io import GGUFFile
from llama_quant.cpu import KernelSet

from ..layers import FFN, DenseFFN, Gating, MoE, MoEConfig
from .base import DecoderModel, register

__all__ = ["Mistral3", "temperature_factors"]


def temperature_factors(n_pos: int, scale: float, n_floor: int) -> np.ndarray:
    """The factors [n_pos] (float32) on q of positions 0..n_pos-1 (llama_graph_input_attn_temp)."""
    pos = np.arange(n_pos, dtype=np.float32)
    steps = np.floor(pos / np.float32(n_floor))  # float, as the C++ divides a float position
    return (np.log(steps.astype(np.float64) + 1.0) * float(np.float32(scale)) + 1.0).astype(np.float32)


@register("mistral3")
class Mistral3(DecoderModel):
    """Dense layers as llama's; MoE layers where the file has experts."""

    def __init__(
        self, gguf: GGUFFile, kernels: KernelSet | str | None = None, exact_floats: bool | None = None
    ) -> None:
        super().__init__(gguf, kernels, exact_floats)
        self.temperature_scale = float(gguf.metadata.get("mistral3.attention.temperature_scale", 0.0))
        self._temp_table = np.zeros(0, np.float32)  # by position, grown on demand
        self._temp = np.zeros(0, np.float32)  # one step's factors, by token

    def load_ffn(self, il: int) -> FFN:
        biases = [n for n in ("ffn_gate", "ffn_up", "ffn_down") if self.has(f"blk.{il}.{n}.bias")]
        if biases:
            raise ValueError(f"layer {il} has FFN biases ({', '.join(biases)}), which are not supported")
        if self.moe is None:
            return DenseFFN.load(self, il, self.activation)
        return MoE.load(self, il, self.moe)

    def q_temperature(self, pos: np.ndarray, n: int) -> np.ndarray | None:
        if self.temperature_scale == 0.0:
            return None
        need = int(pos[:n].max()) + 1
        if len(self._temp_table) < need:
            n_floor = self.rope_scaling.n_ctx_orig
            if n_floor <= 0:
                raise ValueError("attention temperature scaling needs a positive original context length")
            self._temp_table = temperature_factors(max(need, 4096), self.temperature_scale, n_floor)
        if len(self._temp) < n:
            self._temp = np.zeros(n, np.float32)
        out = self._temp[:n]
        np.take(self._temp_table, pos[:n], out=out)
        return out

    @cached_property
    def moe(self) -> MoEConfig | None:
        if not self.header.expert_count:
            return None
        return MoEConfig.from_header(self.header, gating=Gating.SOFTMAX, norm_weights=True)
