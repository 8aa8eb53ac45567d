"""Architectures, one module each, registered by `general.architecture`."""

from __future__ import annotations

import ctypes
import ctypes.util

from gguf_io import GGUFFile
from llama_quant.cpu import KernelSet

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


def load_model(gguf: GGUFFile, kernels: KernelSet | str | None = None) -> DecoderModel:
    """Build the model for the file's architecture, its matrices and attention for the kernel set
    ``kernels`` (``llama_quant.cpu.resolve_kernel_set``: None -> ``LLAMA_KERNELS`` or the host's best); an
    unknown architecture names itself and the supported ones."""
    arch = gguf.header.architecture
    cls = ARCHITECTURES.get(arch)
    if cls is None:
        raise UnsupportedArchitectureError(
            f"architecture {arch!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    model = cls(gguf, kernels)
    _trim_heap()
    return model


def _trim_heap() -> None:
    """Hand the heap pages freed while the weights were repacked back to the system (glibc's
    ``malloc_trim``): the temporaries of large matrices stay resident otherwise (30 MB on a 1 GB
    mixture-of-experts file). Nothing elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # another C library
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
