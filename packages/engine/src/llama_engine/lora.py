"""LoRA adapters: `scale * B(A x)` added beside each adapted weight's product, as llama.cpp's build_lora_mm.

An adapter file is a GGUF with `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha` and,
for each adapted weight `W` (`blk.N.attn_q.weight` ...), the pair `W.lora_a` (ggml shape [n_in, r]) and
`W.lora_b` ([r, n_out]). For a batch x the product becomes

    res = W x;  for each active adapter: res = res + (B (A x)) * s,   s = scale * alpha / r  (scale if alpha 0)

each step rounded to float as ggml rounds it: the two small products through the same exact kernels as the
model's weights, then the scale, then the add. Adapters cover the attention (q, k, v, fused qkv, output)
and FFN (gate, up, down) weights; an adapter for other tensors (token embeddings, the output head) is
refused at load.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from gguf_io import GGUFFile
from gguf_io import open as open_gguf
from llama_quant.cpu import KernelSet
from llama_quant.kernels import ExactMatrix

__all__ = ["LoraAdapter", "LoraError", "LoraWeight", "load_lora"]

# the weights the forward pass adds a delta to: (layer, kind)
_TARGET = re.compile(
    r"blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_qkv|attn_output|ffn_gate|ffn_up|ffn_down)\.weight"
)


class LoraError(ValueError):
    """The file is not a LoRA adapter this model can use (the message says why)."""


@dataclass(frozen=True, slots=True)
class LoraWeight:
    """One adapted weight's low-rank pair: a [r x n_in] and b [n_out x r] (rows = outputs)."""

    a: ExactMatrix
    b: ExactMatrix

    def scale(self, alpha: float, adapter_scale: float) -> np.float32:
        """llama_adapter_lora_weight::get_scale, in float."""
        rank = np.float32(self.b.cols)
        if alpha:
            return np.float32(np.float32(np.float32(adapter_scale) * np.float32(alpha)) / rank)
        return np.float32(adapter_scale)

    def add_to(self, out: np.ndarray, x: np.ndarray, scale: np.float32) -> None:
        """out += (B (A x)) * scale for x [n, n_in] f32 and out [n, n_out] (a view may be a column slice)."""
        t = self.a.matmul(x)
        ab = self.b.matmul(t)
        ab *= scale
        out += ab


@dataclass(slots=True)
class LoraAdapter:
    """A loaded adapter: its weights by (layer, kind), alpha, and the file's llama-server metadata."""

    path: str
    alpha: float
    weights: dict[tuple[int, str], LoraWeight]
    task_name: str = ""
    prompt_prefix: str = ""


def _meta(gguf: GGUFFile, key: str) -> object:
    f = gguf.fields.get(key)
    return None if f is None else f.to_python()


def _matrix(gguf: GGUFFile, name: str, kernels: KernelSet | None, exact: bool) -> ExactMatrix:
    t = gguf.tensors[name]
    if len(t.shape) != 2:
        raise LoraError(f"{name} has shape {list(t.shape)}, expected a matrix")
    args = (gguf.tensor_bytes(name), t.ggml_type, t.shape[1], t.shape[0])
    return ExactMatrix(*args, kernels=kernels, exact=exact)


def load_lora(path: str | os.PathLike[str], model: object) -> LoraAdapter:
    """Read an adapter for `model` (a DecoderModel); raises LoraError naming what does not fit."""
    from .arch.base import DecoderModel  # the model module imports this one

    assert isinstance(model, DecoderModel)
    path = os.fspath(path)
    gguf = open_gguf(path)
    if _meta(gguf, "general.type") != "adapter" or _meta(gguf, "adapter.type") != "lora":
        raise LoraError(f"{path}: not a LoRA adapter (general.type must be 'adapter', adapter.type 'lora')")
    arch = _meta(gguf, "general.architecture")
    if arch != model.config.arch:
        raise LoraError(
            f"{path}: the adapter is for architecture {arch!r}, the model is {model.config.arch!r}"
        )
    alpha = _meta(gguf, "adapter.lora.alpha")
    weights: dict[tuple[int, str], LoraWeight] = {}
    pairs = sorted({n.rsplit(".", 1)[0] for n in gguf.tensors if n.endswith((".lora_a", ".lora_b"))})
    for base in pairs:
        m = _TARGET.fullmatch(base)
        if m is None:
            raise LoraError(f"{path}: adapting {base} is not supported (attention and FFN weights only)")
        if base + ".lora_a" not in gguf.tensors or base + ".lora_b" not in gguf.tensors:
            raise LoraError(f"{path}: {base} needs both lora_a and lora_b")
        target = model._gguf.tensors.get(base)
        if target is None:
            raise LoraError(f"{path}: the model has no tensor {base}")
        a = _matrix(gguf, base + ".lora_a", model.kernels, model.exact_floats)
        b = _matrix(gguf, base + ".lora_b", model.kernels, model.exact_floats)
        n_in, n_out = target.shape[0], target.shape[1]
        if a.cols != n_in or b.rows != n_out:
            raise LoraError(f"{path}: {base} lora shapes do not match the model's weight")
        if a.rows != b.cols:
            raise LoraError(f"{path}: {base}.lora_a is not transposed (lora_a ne[1] must equal lora_b ne[0])")
        weights[(int(m.group(1)), m.group(2))] = LoraWeight(a, b)
    if not weights:
        raise LoraError(f"{path}: the adapter has no lora_a/lora_b tensors")
    return LoraAdapter(
        path=path,
        alpha=float(alpha) if isinstance(alpha, int | float) else 0.0,
        weights=weights,
        task_name=str(_meta(gguf, "adapter.lora.task_name") or ""),
        prompt_prefix=str(_meta(gguf, "adapter.lora.prompt_prefix") or ""),
    )
