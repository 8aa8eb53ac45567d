"""What llama-quant plans for a file, and a file's digest: the two things the whole-file parity tests compare
with llama-quantize."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf_io
from llama_quant.mixture import MixtureParams, ModelInfo, TensorSpec, plan_types, weight_order


def our_types(
    inp: Path, ftype: int, mixture_kw: dict | None = None, has_imatrix: bool = False
) -> dict[str, str]:
    """The plan's type name per tensor of `inp` for file type `ftype` (raises ValueError when it refuses)."""
    with gguf_io.open(inp) as f:
        specs = [
            TensorSpec(n, f.tensors[n].shape, f.tensors[n].ggml_type) for n in weight_order(list(f.tensors))
        ]
        params = MixtureParams(ftype=ftype, has_imatrix=has_imatrix, **(mixture_kw or {}))
        plan = plan_types(specs, ModelInfo.from_metadata(f.metadata), params)
    return {n: t.name for n, t in plan.types.items()}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
