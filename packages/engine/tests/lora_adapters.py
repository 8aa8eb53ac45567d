"""LoRA adapters for a model file, written with gguf-io: random low-rank A/B on attention and FFN weights.

Laid out as llama.cpp's convert_lora_to_gguf writes them: `general.type = adapter`, `adapter.type = lora`,
`adapter.lora.alpha`, and per adapted weight `<name>.lora_a` (ggml shape [n_in, r]) and `<name>.lora_b`
([r, n_out]).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import gguf_io
from gguf_io import GGMLQuantizationType, GGUFValueType, GGUFWriter

__all__ = ["TARGETS", "write_lora"]

TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def write_lora(
    path: Path,
    model: Path,
    seed: int = 0,
    rank: int = 8,
    alpha: float = 16.0,
    targets: tuple[str, ...] = TARGETS,
    layers: tuple[int, ...] | None = None,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    scale: float = 0.02,
) -> Path:
    """An adapter at `path` for the weights `targets` of `layers` (all when None) of the model file."""
    rng = np.random.default_rng(seed)
    with gguf_io.open(model) as f:
        arch = f.header.architecture
        shapes = {n: tuple(t.shape) for n, t in f.tensors.items()}
        n_layer = f.header.block_count
    w = GGUFWriter(path)
    w.add_metadata("general.architecture", arch)
    w.add_metadata("general.type", "adapter")
    w.add_metadata("general.name", f"lora-{seed}")
    w.add_metadata("adapter.type", "lora")
    w.add_metadata("adapter.lora.alpha", float(alpha), GGUFValueType.FLOAT32)
    np_type = np.float16 if qtype == GGMLQuantizationType.F16 else np.float32
    for il in range(n_layer) if layers is None else layers:
        for kind in targets:
            name = f"blk.{il}.{kind}.weight"
            if name not in shapes:
                continue
            n_in, n_out = shapes[name][0], shapes[name][1]
            a = (rng.standard_normal((rank, n_in)) * scale).astype(np_type)
            b = (rng.standard_normal((n_out, rank)) * scale).astype(np_type)
            w.add_tensor(name + ".lora_a", [n_in, rank], qtype, a)
            w.add_tensor(name + ".lora_b", [rank, n_out], qtype, b)
    w.finish()
    return path
