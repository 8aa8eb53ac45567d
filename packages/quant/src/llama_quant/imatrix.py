"""Importance matrices for quantization: llama-imatrix's GGUF files and its legacy ``.dat`` files.

The values handed to the quantizer are llama-quantize's (``tools/quantize/quantize.cpp`` ``load_imatrix``
over ``common/imatrix-loader.cpp``): for GGUF files ``W.in_sum2 / W.counts`` per expert (a count of 0 gives
1.0), for legacy files the stored values divided by their call count.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

import gguf_io
from gguf_io import GGMLQuantizationType, GGUFError

__all__ = ["Imatrix", "load_imatrix"]

_IN_SUM2 = ".in_sum2"
_COUNTS = ".counts"


@dataclass(slots=True)
class Imatrix:
    """Per-weight importance vectors (float32, ``ne0 * n_expert`` values) and the file's provenance."""

    entries: dict[str, np.ndarray]
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    is_legacy: bool = False

    def select(self, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> Imatrix:
        """``prepare_imatrix``: drop names containing an ``exclude`` string, then keep those containing an
        ``include`` string (when any is given)."""
        entries = {k: v for k, v in self.entries.items() if not any(x in k for x in exclude)}
        if include:
            entries = {k: v for k, v in entries.items() if any(x in k for x in include)}
        return Imatrix(entries, list(self.datasets), self.chunk_count, self.is_legacy)


def load_imatrix(path: str | os.PathLike[str]) -> Imatrix:
    """Read an imatrix file (GGUF if it starts with the GGUF magic, else legacy); GGUFError if malformed."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise GGUFError(f"cannot read imatrix file {path!r}: {e.strerror}") from None
    if magic == b"GGUF":
        return _load_gguf(path)
    return _load_legacy(path)


def _load_gguf(path: str) -> Imatrix:
    with gguf_io.open(path) as f:
        md = f.metadata
        if "imatrix.datasets" not in md or "imatrix.chunk_count" not in md or "imatrix.chunk_size" not in md:
            raise GGUFError(f"missing imatrix metadata in file {path}")
        datasets = md["imatrix.datasets"]
        datasets = [str(d) for d in datasets] if isinstance(datasets, list) else []
        chunk_count = int(md["imatrix.chunk_count"])
        pairs: dict[str, list] = {}
        for name, info in f.tensors.items():
            if name.endswith(_IN_SUM2):
                pairs.setdefault(name[: -len(_IN_SUM2)], [None, None])[0] = info
            elif name.endswith(_COUNTS):
                pairs.setdefault(name[: -len(_COUNTS)], [None, None])[1] = info
        if not f.tensors:
            raise GGUFError(f"no data in imatrix file {path}")
        entries: dict[str, np.ndarray] = {}
        for name in sorted(pairs):
            sums_info, counts_info = pairs[name]
            if sums_info is None or counts_info is None:
                raise GGUFError(f"imatrix {path}: mismatched sums and counts for {name}")
            if (
                sums_info.ggml_type != GGMLQuantizationType.F32
                or counts_info.ggml_type != GGMLQuantizationType.F32
            ):
                raise GGUFError(f"imatrix {path}: sums and counts for {name} must be F32")
            sums = f.tensor_bytes(sums_info.name).view(np.float32)
            counts = f.tensor_bytes(counts_info.name).view(np.float32)
            if counts.size == 0 or sums.size % counts.size:
                raise GGUFError(f"imatrix {path}: {sums.size} sums do not split into {counts.size} experts")
            ne0 = sums.size // counts.size
            # std::lround to int64, then back to float for the division (both in float32)
            n = np.floor(np.abs(counts.astype(np.float64)) + 0.5) * np.sign(counts)
            values = np.ones(sums.size, dtype=np.float32)
            for j, c in enumerate(n.astype(np.float32)):
                if c > 0:
                    values[j * ne0 : (j + 1) * ne0] = sums[j * ne0 : (j + 1) * ne0] / np.float32(c)
            entries[name] = values
    return Imatrix(entries, datasets, chunk_count, False)


def _load_legacy(path: str) -> Imatrix:
    with open(path, "rb") as fh:
        data = fh.read()
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(data):
            raise GGUFError(f"imatrix {path}: truncated while reading {what}")
        out = data[pos : pos + n]
        pos += n
        return out

    def i32(what: str) -> int:
        return struct.unpack("<i", take(4, what))[0]

    if len(data) < 4:
        raise GGUFError(f"imatrix {path}: not a GGUF or legacy imatrix file (too short)")
    n_entries = i32("the entry count")
    if n_entries < 1:
        raise GGUFError(f"no data in imatrix file {path}")
    entries: dict[str, np.ndarray] = {}
    for i in range(n_entries):
        name_len = i32(f"the name length of entry {i + 1}")
        raw = take(name_len, f"the name of entry {i + 1}")
        name = raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")
        ncall = i32(f"the call count of entry {i + 1}")
        nval = i32(f"the value count of entry {i + 1}")
        if nval < 1:
            raise GGUFError(f"imatrix {path}: entry {i + 1} ({name!r}) has {nval} values")
        values = np.frombuffer(take(4 * nval, f"the values of {name!r}"), dtype="<f4").astype(np.float32)
        if ncall > 0:
            values = values / np.float32(ncall)
        entries[name] = values
    datasets: list[str] = []
    chunk_count = 0
    if pos + 4 <= len(data):
        chunk_count = i32("the chunk count")
        if pos + 4 <= len(data):
            n = i32("the dataset name length")
            if n > 0 and pos + n <= len(data):
                datasets.append(take(n, "the dataset name").split(b"\0", 1)[0].decode("utf-8", "replace"))
    return Imatrix(entries, datasets, chunk_count, True)
