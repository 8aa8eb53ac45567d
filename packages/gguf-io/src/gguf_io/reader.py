"""Parse one GGUF file through mmap: header, metadata, tensor table. Tensor data is never read here.

Every length, count and offset read from the file is checked against the bytes that remain before it is
used, with Python ints (which cannot wrap), so a hostile file can make the parser neither allocate more
than the file's size nor read outside it. Counterpart: `gguf_init_from_file_impl` in ggml's gguf.cpp.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from .constants import (
    DEFAULT_ALIGNMENT,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGML_QUANT_SIZES,
    GGUF_MAGIC,
    MAX_ARRAY_LENGTH,
    MAX_KEY_LENGTH,
    SCALAR_DTYPES,
    SUPPORTED_VERSIONS,
    GGMLQuantizationType,
    GGUFValueType,
)
from .errors import GGUFError

__all__ = ["Field", "ParsedFile", "TensorInfo", "parse_file", "tensor_nbytes"]

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_INT64_MAX = (1 << 63) - 1
# Smallest encodings, used to bound counts by the bytes left: a key/value pair is at least a key length,
# a type and one byte of value; a tensor info is at least a name length, n_dims, a type and an offset.
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8


@dataclass(frozen=True, slots=True)
class Field:
    """One metadata key/value with its exact GGUF types (what a writer needs to reproduce it).

    `value` is a Python scalar or `str` for scalar types; for arrays it is a read-only numpy array
    (numeric items, zero-copy from the file) or a list of `str`.
    """

    name: str
    value_type: GGUFValueType
    value: Any
    array_type: GGUFValueType | None = None

    def to_python(self) -> Any:
        """The value as plain Python: scalars, `str`, or a list for arrays."""
        if self.value_type == GGUFValueType.ARRAY:
            if isinstance(self.value, np.ndarray):
                items = self.value.tolist()
                return [bool(v) for v in items] if self.array_type == GGUFValueType.BOOL else items
            return list(self.value)
        return self.value


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One entry of the tensor table.

    `shape` is in ggml order (ne0, the row length, first), as stored in the file and as gguf-py reports it;
    `np_shape` is the numpy order. `offset` is the absolute byte offset of the data in its file (`shard`).
    """

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    shard: int = 0

    @property
    def np_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class ParsedFile:
    """What `parse_file` found in one file; the mmap stays open for tensor views."""

    path: str
    version: int
    alignment: int
    fields: dict[str, Field]
    tensors: dict[str, TensorInfo]
    data_offset: int
    size: int
    mm: mmap.mmap | None


def tensor_nbytes(ggml_type: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of this type and ggml-order shape; the row length must fill whole blocks."""
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    if shape and shape[0] % block_size:
        raise GGUFError(
            f"row length {shape[0]} is not a multiple of the {ggml_type.name} block size {block_size}"
        )
    return math.prod(shape) // block_size * type_size


class _Cursor:
    """Sequential little-endian reads over a buffer, each bounded by the bytes that remain."""

    __slots__ = ("buf", "path", "pos", "size")

    def __init__(self, buf: Any, size: int, path: str) -> None:
        self.buf = buf
        self.size = size
        self.path = path
        self.pos = 0

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what} (at byte offset {self.pos})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"file is truncated: {what} needs {n} bytes, {self.size - self.pos} remain")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def string(self, what: str, max_len: int | None = None) -> str:
        n = self.u64(f"length of {what}")
        if max_len is not None and n > max_len:
            raise self.fail(f"{what} is {n} bytes long, more than the limit of {max_len}")
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        try:
            s = str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})") from None
        self.pos += n
        return s

    def value_type(self, what: str) -> GGUFValueType:
        t = self.u32(what)
        try:
            return GGUFValueType(t)
        except ValueError:
            raise self.fail(f"{what}: unknown value type {t}") from None

    def scalar(self, vtype: GGUFValueType, key: str) -> Any:
        dtype = SCALAR_DTYPES[vtype]
        self.need(dtype.itemsize, f"value of {key!r}")
        v = np.frombuffer(self.buf, dtype, 1, self.pos)[0]
        self.pos += dtype.itemsize
        if vtype == GGUFValueType.BOOL:
            if v > 1:
                raise self.fail(f"value of {key!r} is a bool stored as {int(v)}, expected 0 or 1")
            return bool(v)
        return v.item()

    def _string_items(self, count: int, key: str) -> list[str]:
        """The items of a string array: the hot loop of opening a model with a large vocabulary."""
        buf, size, pos = self.buf, self.size, self.pos
        unpack = _U64.unpack_from
        items: list[str] = []
        append = items.append
        try:
            for _ in range(count):
                (n,) = unpack(buf, pos)
                pos += 8
                end = pos + n
                if end > size:
                    break
                append(str(buf[pos:end], "utf-8"))
                pos = end
        except struct.error:
            pass  # fewer than 8 bytes left for a length: reported as truncation below
        except UnicodeDecodeError as e:
            self.pos = pos
            raise self.fail(f"item {len(items)} of array {key!r} is not valid UTF-8 ({e.reason})") from None
        self.pos = pos
        if len(items) < count:
            raise self.fail(f"file is truncated inside item {len(items)} of string array {key!r}")
        return items

    def array(self, key: str) -> tuple[GGUFValueType, Any]:
        itype = self.value_type(f"item type of array {key!r}")
        if itype == GGUFValueType.ARRAY:
            raise self.fail(f"array {key!r} holds arrays; nested arrays are not supported")
        count = self.u64(f"length of array {key!r}")
        if count > MAX_ARRAY_LENGTH:
            raise self.fail(f"array {key!r} claims {count} items, more than the limit of {MAX_ARRAY_LENGTH}")
        if itype == GGUFValueType.STRING:
            self.need(count * 8, f"{count} strings of array {key!r}")
            return itype, self._string_items(count, key)
        dtype = SCALAR_DTYPES[itype]
        self.need(count * dtype.itemsize, f"{count} items of array {key!r}")
        arr = np.frombuffer(self.buf, dtype, count, self.pos)
        self.pos += count * dtype.itemsize
        if itype == GGUFValueType.BOOL and count and int(arr.max()) > 1:
            raise self.fail(f"array {key!r} holds a bool that is neither 0 nor 1")
        return itype, arr


def _read_fields(cur: _Cursor, n_kv: int) -> dict[str, Field]:
    fields: dict[str, Field] = {}
    for i in range(n_kv):
        key = cur.string(f"key of metadata entry {i}", MAX_KEY_LENGTH)
        if key in fields:
            raise cur.fail(f"metadata key {key!r} appears twice")
        vtype = cur.value_type(f"type of {key!r}")
        if vtype == GGUFValueType.ARRAY:
            itype, value = cur.array(key)
            fields[key] = Field(key, vtype, value, itype)
        elif vtype == GGUFValueType.STRING:
            fields[key] = Field(key, vtype, cur.string(f"value of {key!r}"))
        else:
            fields[key] = Field(key, vtype, cur.scalar(vtype, key))
    return fields


def _read_alignment(cur: _Cursor, fields: dict[str, Field]) -> int:
    f = fields.get("general.alignment")
    if f is None:
        return DEFAULT_ALIGNMENT
    if f.value_type != GGUFValueType.UINT32:
        raise cur.fail(f"general.alignment must be a uint32, found {f.value_type.name}")
    a = int(f.value)
    if a == 0 or a & (a - 1):
        raise cur.fail(f"general.alignment must be a power of two, found {a}")
    return a


def _read_tensor_table(cur: _Cursor, n_tensors: int) -> list[tuple[str, GGMLQuantizationType, tuple, int]]:
    table = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = cur.string(f"name of tensor {i}", GGML_MAX_NAME - 1)
        if name in names:
            raise cur.fail(f"tensor name {name!r} appears twice")
        names.add(name)
        n_dims = cur.u32(f"n_dims of tensor {name!r}")
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions; 1 to {GGML_MAX_DIMS} are allowed")
        shape = tuple(cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims))
        n_elements = math.prod(shape)
        if any(d > _INT64_MAX for d in shape) or n_elements > _INT64_MAX:
            raise cur.fail(f"tensor {name!r} has shape {list(shape)} whose element count overflows int64")
        raw_type = cur.u32(f"type of tensor {name!r}")
        try:
            gtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise cur.fail(f"tensor {name!r} has unknown ggml type {raw_type}") from None
        if gtype not in GGML_QUANT_SIZES:
            raise cur.fail(f"tensor {name!r} has ggml type {gtype.name}, which has no known block size")
        rel = cur.u64(f"data offset of tensor {name!r}")
        table.append((name, gtype, shape, rel))
    return table


def _place_tensors(cur: _Cursor, table: list, alignment: int, data_offset: int) -> dict[str, TensorInfo]:
    """Check that tensor data is aligned, in table order, non-overlapping and inside the file."""
    tensors: dict[str, TensorInfo] = {}
    end_of_previous = 0
    data_size = cur.size - data_offset
    for name, gtype, shape, rel in table:
        try:
            nbytes = tensor_nbytes(gtype, shape)
        except GGUFError as e:
            raise cur.fail(f"tensor {name!r}: {e}") from None
        if rel % alignment:
            raise cur.fail(
                f"tensor {name!r} data offset {rel} is not a multiple of the alignment {alignment}"
            )
        if rel < end_of_previous:
            raise cur.fail(
                f"tensor {name!r} data at offset {rel} overlaps or precedes the previous tensor's data "
                f"(which ends at {end_of_previous}); tensor data must be stored in table order"
            )
        if rel + nbytes > data_size:
            raise cur.fail(
                f"tensor {name!r} data ({nbytes} bytes at data offset {rel}) extends past the end of the file "
                f"({data_size} bytes of tensor data)"
            )
        end_of_previous = rel + nbytes
        tensors[name] = TensorInfo(name, gtype, shape, data_offset + rel, nbytes)
    return tensors


def _open_mmap(path: str) -> tuple[mmap.mmap | None, int]:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return None, 0
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), size
    except IsADirectoryError:
        raise GGUFError(f"{path}: is a directory, not a GGUF file") from None
    except OSError as e:
        raise GGUFError(f"{path}: cannot open: {e.strerror or e}") from None


def parse_file(path: str | os.PathLike[str]) -> ParsedFile:
    """Parse and validate the header, metadata and tensor table of one GGUF file."""
    spath = os.fspath(path)
    mm, size = _open_mmap(spath)
    try:
        return _parse(spath, mm, size)
    except BaseException:
        if mm is not None:
            # Arrays parsed before the error may still reference the mapping; it goes when they do.
            with contextlib.suppress(BufferError):
                mm.close()
        raise


def _parse(path: str, mm: mmap.mmap | None, size: int) -> ParsedFile:
    cur = _Cursor(mm if mm is not None else b"", size, path)
    cur.need(4, "magic")
    magic = bytes(cur.buf[0:4])
    if magic != GGUF_MAGIC:
        raise cur.fail(f"not a GGUF file: magic is {magic!r}, expected {GGUF_MAGIC!r}")
    cur.pos = 4
    version = cur.u32("version")
    if version == 1:
        raise cur.fail("GGUF version 1 is not supported (it predates 64-bit counts); convert the model again")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 16) in (0x0200, 0x0300):
            raise cur.fail("this is a big-endian GGUF file; only little-endian files are supported")
        raise cur.fail(f"unsupported GGUF version {version}; versions 2 and 3 are supported")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    left = size - cur.pos
    if n_kv * _MIN_KV_BYTES > left:
        raise cur.fail(f"metadata count {n_kv} cannot fit in the {left} bytes left in the file")
    if n_tensors * _MIN_TENSOR_INFO_BYTES > left:
        raise cur.fail(f"tensor count {n_tensors} cannot fit in the {left} bytes left in the file")
    fields = _read_fields(cur, n_kv)
    alignment = _read_alignment(cur, fields)
    table = _read_tensor_table(cur, n_tensors)
    data_offset = -(-cur.pos // alignment) * alignment
    if table and data_offset > size:
        raise cur.fail("file is truncated before the tensor data section")
    tensors = _place_tensors(cur, table, alignment, data_offset)
    return ParsedFile(path, version, alignment, fields, tensors, data_offset, size, mm)
