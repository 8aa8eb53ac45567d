"""Architectures, one module each, registered by `general.architecture`."""

from __future__ import annotations

from gguf_io import GGUFFile
from llama_quant.cpu import KernelSet

from ..heap import trim_heap
from . import (  # noqa: F401  (each registers itself)
    gemma3,
    gemma4,
    gpt_oss,
    granitehybrid,
    lfm2,
    llama,
    mistral3,
    phi3,
    qwen2,
    qwen3,
    qwen3moe,
    qwen35,
    smollm3,
)
from .base import ARCHITECTURES, DecoderModel, ModelConfig, UnsupportedArchitectureError, register

__all__ = [
    "ARCHITECTURES",
    "DecoderModel",
    "ModelConfig",
    "UnsupportedArchitectureError",
    "load_model",
    "register",
]


def load_model(
    gguf: GGUFFile, kernels: KernelSet | str | None = None, exact_floats: bool | None = None
) -> DecoderModel:
    """Build the model for the file's architecture, its matrices and attention for the kernel set
    ``kernels`` (``llama_quant.cpu.resolve_kernel_set``: None -> ``LLAMA_KERNELS`` or the host's best), its
    F16 / BF16 / F32 matrices exact or fast (``llama_quant.cpu.resolve_exact_floats``: None ->
    ``LLAMA_EXACT_FLOATS``, else fast); an unknown architecture names itself and the supported ones."""
    arch = gguf.header.architecture
    cls = ARCHITECTURES.get(arch)
    if cls is None:
        raise UnsupportedArchitectureError(
            f"architecture {arch!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    model = cls(gguf, kernels, exact_floats)
    trim_heap()  # the repacking's freed temporaries (30 MB on a 1 GB mixture-of-experts file)
    return model
