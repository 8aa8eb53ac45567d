"""`GGUFFile`: one model, backed by the mmap of one file or of every shard of a split model."""

from __future__ import annotations

import contextlib
import mmap
import os
import re
from functools import cached_property
from typing import Any

import numpy as np

from .constants import GGUFValueType
from .errors import GGUFError
from .header import ModelHeader, TokenizerData
from .reader import Field, ParsedFile, TensorInfo, parse_file

__all__ = ["GGUFFile", "open", "split_path"]

_SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_MAX_SPLITS = 9999


def split_path(prefix: str, split_no: int, split_count: int) -> str:
    """The file name of shard `split_no` (0-based) as llama.cpp's `llama_split_path` forms it."""
    return f"{prefix}-{split_no + 1:05d}-of-{split_count:05d}.gguf"


class GGUFFile:
    """An open GGUF model. Use `gguf_io.open(path)`; close it, or use it as a context manager.

    Opening parses and validates the header, metadata and tensor table of every shard; tensor data is
    only touched through `tensor_bytes`, which returns zero-copy views of the mmap.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._shards: list[ParsedFile] = []
        try:
            first = parse_file(self.path)
            self._shards.append(first)
            self._shards.extend(self._open_other_shards(first))
            self.tensors: dict[str, TensorInfo] = self._merge_tensor_tables()
        except BaseException:
            self.close()
            raise
        self.version: int = first.version
        self.alignment: int = first.alignment
        self.fields: dict[str, Field] = first.fields
        self.data_offset: int = first.data_offset
        self._closed = False

    # -- split models ----------------------------------------------------------------------------------

    def _split_count(self, parsed: ParsedFile) -> int:
        f = parsed.fields.get("split.count")
        if f is None:
            return 1
        if f.value_type not in (GGUFValueType.UINT16, GGUFValueType.UINT32, GGUFValueType.INT32):
            raise GGUFError(f"{parsed.path}: split.count must be an integer, found {f.value_type.name}")
        n = int(f.value)
        if not 1 <= n <= _MAX_SPLITS:
            raise GGUFError(f"{parsed.path}: split.count is {n}, expected 1..{_MAX_SPLITS}")
        return n

    def _split_no(self, parsed: ParsedFile) -> int:
        f = parsed.fields.get("split.no")
        if f is None or f.value_type not in (GGUFValueType.UINT16, GGUFValueType.UINT32, GGUFValueType.INT32):
            raise GGUFError(f"{parsed.path}: split.no is missing or not an integer in a split model")
        return int(f.value)

    def _open_other_shards(self, first: ParsedFile) -> list[ParsedFile]:
        count = self._split_count(first)
        if count == 1:
            return []
        m = _SPLIT_RE.match(self.path)
        if m is None or int(m["count"]) != count:
            raise GGUFError(
                f"{self.path}: part of a model split into {count} files, but its name does not follow "
                f"the NAME-00001-of-{count:05d}.gguf pattern"
            )
        if int(m["no"]) != 1 or self._split_no(first) != 0:
            raise GGUFError(f"{self.path}: open the first shard ({split_path(m['prefix'], 0, count)})")
        shards = []
        for i in range(1, count):
            p = split_path(m["prefix"], i, count)
            if not os.path.exists(p):
                raise GGUFError(f"{self.path}: shard {i + 1} of {count} is missing: {p}")
            shard = parse_file(p)
            shards.append(shard)
            if self._split_count(shard) != count or self._split_no(shard) != i:
                raise GGUFError(f"{p}: split.no/split.count do not say shard {i + 1} of {count}")
        return shards

    def _merge_tensor_tables(self) -> dict[str, TensorInfo]:
        if len(self._shards) == 1:
            return self._shards[0].tensors
        merged: dict[str, TensorInfo] = {}
        for i, shard in enumerate(self._shards):
            for name, t in shard.tensors.items():
                if name in merged:
                    raise GGUFError(f"{shard.path}: tensor {name!r} is also in an earlier shard")
                merged[name] = TensorInfo(t.name, t.ggml_type, t.shape, t.offset, t.nbytes, i)
        expected = self._shards[0].fields.get("split.tensors.count")
        if expected is not None and int(expected.value) != len(merged):
            raise GGUFError(
                f"{self.path}: split.tensors.count says {int(expected.value)} tensors, the shards hold {len(merged)}"
            )
        return merged

    @property
    def paths(self) -> list[str]:
        """The file of every shard, first to last (one entry for an unsplit model)."""
        return [s.path for s in self._shards]

    # -- data ------------------------------------------------------------------------------------------

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The raw bytes of tensor `name` as a read-only uint8 numpy view of the mmap (no copy)."""
        if self._closed:
            raise GGUFError(f"{self.path}: file is closed")
        try:
            t = self.tensors[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in {self.path}") from None
        mm = self._shards[t.shard].mm
        if t.nbytes == 0 or mm is None:
            return np.zeros(0, dtype=np.uint8)
        return np.frombuffer(mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def release(self, name: str | None = None) -> None:
        """Drop the file pages of tensor `name` (of every tensor: None) from this process's resident memory,
        for a caller that has copied the data out (madvise MADV_DONTNEED; nothing where mmap lacks it).
        Views stay valid: a page touched again is read back from the file. Pages shared with a neighbouring
        tensor are dropped too, and come back the same way."""
        if self._closed:
            return
        spans: list[tuple[mmap.mmap | None, int, int]]
        if name is None:
            spans = [(shard.mm, 0, len(shard.mm)) for shard in self._shards if shard.mm is not None]
        else:
            t = self.tensors.get(name)
            if t is None:
                raise KeyError(f"no tensor named {name!r} in {self.path}")
            spans = [(self._shards[t.shard].mm, t.offset, t.nbytes)]
        for mm, start, nbytes in spans:
            if mm is None or nbytes == 0 or not hasattr(mm, "madvise"):
                continue
            page = mmap.PAGESIZE
            first = start // page * page
            end = min(len(mm), -(-(start + nbytes) // page) * page)
            with contextlib.suppress(OSError, ValueError):  # a closed mapping, or one madvise refuses
                mm.madvise(mmap.MADV_DONTNEED, first, end - first)

    @cached_property
    def metadata(self) -> dict[str, Any]:
        """Every metadata key mapped to a plain Python value (arrays as lists), in file order."""
        return {k: f.to_python() for k, f in self.fields.items()}

    @cached_property
    def header(self) -> ModelHeader:
        """The model's architecture and hyperparameters (built on first use, then cached)."""
        return ModelHeader.from_fields(self.fields, self.path)

    @cached_property
    def tokenizer(self) -> TokenizerData:
        """The tokenizer's vocabulary, merges, special ids and chat template (built on first use)."""
        return TokenizerData.from_fields(self.fields, self.path)

    # -- lifetime --------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the mmaps. Views handed out earlier keep their mapping alive until they are dropped."""
        self._closed = True
        for shard in self._shards:
            if shard.mm is not None:
                # A tensor view may still reference the mapping; it then goes when the view does.
                with contextlib.suppress(BufferError):
                    shard.mm.close()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"GGUFFile({self.path!r}, v{self.version}, {len(self.fields)} keys, {len(self.tensors)} tensors)"
        )


def open(path: str | os.PathLike[str]) -> GGUFFile:
    """Open a GGUF model (the first shard of a split model opens all of it). Raises `GGUFError`."""
    return GGUFFile(path)
