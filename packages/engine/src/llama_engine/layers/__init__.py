"""Layer kinds, as llama.cpp's graph builders: each holds one layer's weights and runs its step.

``ffn.DenseFFN`` (build_ffn) and ``moe.MoE`` (build_moe_ffn, its router kernels in ``routing``); in
attention's place, the recurrent ``short_conv.ShortConv`` (lfm2) and
``mamba2.Mamba2`` (granitehybrid) with its state in the model's memory. An
architecture says which kind each of its layers is (``DecoderModel.load_ffn``); the numpy references of
the kinds' kernels are in ``ref``.
"""

from __future__ import annotations

from .ffn import DenseFFN
from .mamba2 import Mamba2, Mamba2Buffers, Mamba2Shape
from .moe import MoE, MoEBuffers, MoEConfig
from .routing import Gating
from .short_conv import ShortConv, ShortConvBuffers

FFN = DenseFFN | MoE  # a layer's FFN kind

__all__ = [
    "FFN",
    "DenseFFN",
    "Gating",
    "Mamba2",
    "Mamba2Buffers",
    "Mamba2Shape",
    "MoE",
    "MoEBuffers",
    "MoEConfig",
    "ShortConv",
    "ShortConvBuffers",
]
