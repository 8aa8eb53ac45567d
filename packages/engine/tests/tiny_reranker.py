"""A tiny causal reranker written with gguf-io: the tiny qwen3 model with a two-label classification head.

Laid out as llama.cpp's converter writes Qwen3-Reranker: `qwen3.pooling_type = 4` (rank),
`qwen3.classifier.output_labels = ["yes", "no"]`, `cls.output.weight` [2 x n_embd] and a `rerank` prompt
template. The head is small, so the scores are spread over (0, 1) rather than saturated.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tiny_models import N_EMBD, write_tiny_model

from gguf_io import GGMLQuantizationType, GGUFValueType, GGUFWriter

__all__ = ["RERANK_TEMPLATE", "write_tiny_reranker"]

RERANK_TEMPLATE = "<s>query: {query}\ndocument: {document}</s>"


def write_tiny_reranker(path: Path, seed: int = 3, template: str | None = RERANK_TEMPLATE) -> Path:
    """The reranker at `path` (without `template`, pairs are formatted from the vocabulary's flags)."""

    def head(w: GGUFWriter, rng: np.random.Generator) -> None:
        w.add_metadata("qwen3.pooling_type", 4, GGUFValueType.UINT32)
        w.add_metadata("qwen3.classifier.output_labels", ["yes", "no"])
        if template is not None:
            w.add_metadata("tokenizer.chat_template.rerank", template)
        cls = (0.05 * rng.standard_normal((2, N_EMBD))).astype(np.float32)
        w.add_tensor("cls.output.weight", [N_EMBD, 2], GGMLQuantizationType.F32, cls)

    return write_tiny_model(path, "qwen3", seed=seed, extra=head)
