"""Importance-matrix collection: the squared activations entering every matrix product, per input column.

`ImatrixCollector` is installed as the model's ``collector`` for the duration of a run (`collecting`); the
forward pass hands it the f32 input rows at each product site and it adds, per weight name, the sums of
squares, the plain sums and the row count (``llama_quant.imatrix_file.ImatrixEntry``). As llama-imatrix,
products over fewer than 16 rows are ignored, and the output head only with ``process_output``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from llama_quant.imatrix_file import ImatrixData, ImatrixEntry

from .arch import DecoderModel

__all__ = ["MIN_ROWS", "ImatrixCollector", "collecting"]

MIN_ROWS = 16  # llama-imatrix skips smaller products


class ImatrixCollector:
    """Accumulates activation statistics into ``data`` for the weights of ``model``."""

    def __init__(self, model: DecoderModel, data: ImatrixData, process_output: bool = False) -> None:
        self.data = data
        self.process_output = process_output
        self._names = {
            site: _site_names(model, site) for site in ("qkv", "attn_output", "ffn_in", "ffn_down")
        }
        self._output = "output.weight" if model.has("output.weight") else "token_embd.weight"

    def observe(self, il: int, site: str, x: np.ndarray) -> None:
        """Add the rows ``x`` [n, n_cols] to the entries of the weights that read them."""
        if len(x) < MIN_ROWS:
            return
        if site == "output":
            if not self.process_output:
                return
            names = [self._output]
        else:
            names = [n.format(il) for n in self._names[site]]
        x64 = x.astype(np.float64)
        sq = np.einsum("ij,ij->j", x64, x64)
        s = x64.sum(axis=0)
        for name in names:
            e = self.data.entries.get(name)
            if e is None:
                e = self.data.entries[name] = ImatrixEntry.empty(x.shape[1])
            e.sum2[0] += sq
            if e.sums is not None:
                e.sums[0] += s
            e.counts += len(x)

    def max_rows(self) -> int:
        """The largest row count of any entry (what the chunk counter follows)."""
        return max((int(e.counts.max()) for e in self.data.entries.values()), default=0)


def _site_names(model: DecoderModel, site: str) -> list[str]:
    """The weight names (``{}`` = block index) of the products reading the input of ``site``."""
    options = {
        "qkv": (["attn_qkv"], ["attn_q", "attn_k", "attn_v"]),
        "attn_output": (["attn_output"],),
        "ffn_in": (["ffn_gate", "ffn_up"], ["ffn_up"]),
        "ffn_down": (["ffn_down"],),
    }[site]
    for group in options:
        present = [g for g in group if model.has(f"blk.0.{g}.weight")]
        if present:
            return [f"blk.{{}}.{g}.weight" for g in present]
    return []


@contextmanager
def collecting(model: DecoderModel, collector: ImatrixCollector) -> Iterator[ImatrixCollector]:
    """Install ``collector`` on ``model`` for the block (the instance attribute shadows the class's None)."""
    model.collector = collector
    try:
        yield collector
    finally:
        del model.collector
