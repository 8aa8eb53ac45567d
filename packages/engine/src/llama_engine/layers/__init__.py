"""Layer kinds, as llama.cpp's graph builders: each holds one layer's weights and runs its step.

``ffn.DenseFFN`` (build_ffn) and ``moe.MoE`` (build_moe_ffn, its router kernels in ``routing``). An
architecture says which kind each of its layers is (``DecoderModel.load_ffn``); the numpy references of
the kinds' kernels are in ``ref``.
"""

from __future__ import annotations

from .ffn import DenseFFN
from .moe import MoE, MoEBuffers, MoEConfig
from .routing import Gating

FFN = DenseFFN | MoE  # a layer's FFN kind

__all__ = ["FFN", "DenseFFN", "Gating", "MoE", "MoEBuffers", "MoEConfig"]
