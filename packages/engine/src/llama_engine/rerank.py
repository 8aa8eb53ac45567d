"""Rank pooling: the score a reranker gives a (query, document) prompt, as llama.cpp computes it.

A causal reranker (Qwen3-Reranker and other decoder models converted with a classification head) reads
the last token's final-normed hidden state (llama.cpp's RANK pooling with causal attention) and passes it
through the head the file carries: `cls.output.weight` (rows = output labels) with an optional
`cls.output.bias`, then a softmax over the labels for the Qwen3 family. A model without a head scores
with its raw hidden state. The server reports element 0 as the relevance score.

The head runs through the same exact kernels as the model's matrices and ggml's softmax, so the scores
equal llama.cpp's bit for bit.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

from llama_quant.kernels import ExactMatrix

from .arch.base import _FORWARD_LOCK, DecoderModel
from .ops.ref import expf as _v_expf
from .tokenizer import Tokenizer

__all__ = ["RankHead", "rerank_prompt", "soft_max"]

# the C library's expf: ggml takes it for the elements after the last group of four
_libm = ctypes.CDLL(ctypes.util.find_library("m") or None)
_libm.expf.argtypes, _libm.expf.restype = [ctypes.c_float], ctypes.c_float


def soft_max(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max of one row as the portable CPU build computes it: groups of four through ggml_v_expf
    (SSE2), each group summed pairwise in float, then the rest through libm's expf, all summed in double;
    times 1 / sum rounded to float."""
    x = np.asarray(x, np.float32)
    mx = np.float32(x.max())
    n4 = len(x) - len(x) % 4
    y = np.empty_like(x)
    total = 0.0
    if n4:
        y[:n4] = _v_expf(x[:n4] - mx)
        q = y[:n4].reshape(-1, 4)
        for g in (q[:, 0] + q[:, 1]) + (q[:, 2] + q[:, 3]):
            total += float(g)
    for i in range(n4, len(x)):
        y[i] = _libm.expf(float(x[i] - mx))
        total += float(y[i])
    return y * np.float32(1.0 / total)


# architectures whose rank pooling ends in a softmax over the labels (llama.cpp's build_pooling)
_SOFTMAX_ARCHES = frozenset({"qwen3", "qwen3vl"})


class RankHead:
    """The classification head of a reranker: pooled hidden state -> label scores."""

    def __init__(self, model: DecoderModel) -> None:
        self.out: ExactMatrix | None = model.matrix("cls.output.weight")
        self.out_b = model.vec_or_none("cls.output.bias")
        if self.out is not None and self.out.cols != model.config.n_embd:
            raise ValueError(
                f"cls.output.weight reads {self.out.cols} inputs, the model has {model.config.n_embd}"
            )
        self.softmax = model.config.arch in _SOFTMAX_ARCHES
        labels = model._gguf.fields.get(f"{model.config.arch}.classifier.output_labels")
        # llama.cpp keeps n_cls_out values per sequence: one per label, 1 without labels
        self.n_out = len(labels.to_python()) if labels is not None else 1
        if self.out is not None and self.out.rows != self.n_out:
            raise ValueError(f"cls.output.weight has {self.out.rows} rows for {self.n_out} classifier labels")

    def __call__(self, row: np.ndarray) -> np.ndarray:
        """Scores [n_labels] of one pooled row [n_embd] (without a head: the row's first n_labels values,
        after the softmax where the architecture has one)."""
        x = np.array(row, np.float32).reshape(1, -1)
        if self.out is not None:
            with _FORWARD_LOCK:  # one kernel launch at a time per process (see arch.base)
                x = self.out.matmul(x)
            if self.out_b is not None:
                x = x + self.out_b
        y = x[0].astype(np.float32)
        if self.softmax:
            y = soft_max(y)
        return y[: self.n_out].copy()


def rerank_prompt(tokenizer: Tokenizer, template: str | None, query: str, document: str) -> list[int]:
    """The token ids llama-server scores for one pair (its format_prompt_rerank).

    With the model's `rerank` template (`tokenizer.chat_template.rerank`), `{query}` then `{document}` are
    substituted and the text is tokenized with special tokens parsed and none added. Without one:
    [BOS] query [EOS] [SEP] document [EOS], each marker as the vocabulary's add_* flags say (EOS falls
    back to SEP)."""
    encode = tokenizer.encode
    if template is not None:
        text = template.replace("{query}", query).replace("{document}", document)
        return encode(text, add_special=False, parse_special=True)
    v = tokenizer.vocab
    end = v.eos_id if v.eos_id is not None else v.sep_id
    out: list[int] = []
    if v.add_bos and v.bos_id is not None:
        out.append(v.bos_id)
    out += encode(query, add_special=False)
    if v.add_eos and end is not None:
        out.append(end)
    if v.add_sep and v.sep_id is not None:
        out.append(v.sep_id)
    out += encode(document, add_special=False)
    if v.add_eos and end is not None:
        out.append(end)
    return out
