"""The non-matmul operations of a transformer forward pass, as ggml computes them on the CPU.

One module per concept: ``norm`` (RMS norm and the residual step), ``rope``, ``attention`` (with its
register ``tiles``), ``glu`` (SwiGLU, GeGLU), ``expf`` (ggml_v_expf) and ``_intrinsics`` (fp16 and bit
casts). Each numba kernel is a flat function with an out-parameter and explicit sizes; its plain-numpy
reference is in ``ref``, and tests compare the two. The numerics follow ggml-cpu where it matters for
parity with llama.cpp: RMS norm accumulates in double (ggml_float), GELU goes through ggml's fp16 lookup
table (GGML_GELU_FP16), RoPE angles are built by repeated float multiplication as in ggml_rope_cache_init.
"""

from __future__ import annotations

from .attention import TILE_WIDTHS, attend, attention, tiles_for
from .flash_attn import attend_typed, attention_typed
from .glu import geglu, gelu_table, swiglu
from .norm import output_norm, residual_norm, rms_norm
from .rope import ROPE_NEOX, ROPE_NORM, rope, rope_cache

__all__ = [
    "ROPE_NEOX",
    "ROPE_NORM",
    "TILE_WIDTHS",
    "attend",
    "attend_typed",
    "attention",
    "attention_typed",
    "geglu",
    "gelu_table",
    "output_norm",
    "residual_norm",
    "rms_norm",
    "rope",
    "rope_cache",
    "swiglu",
    "tiles_for",
]
