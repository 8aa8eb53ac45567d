"""`GGUFWriter`: write a GGUF file (or a split model) atomically, streaming tensors one at a time.

Layout as ggml's `gguf_write_to_file`: header, metadata, tensor infos, padding to the alignment, then each
tensor's data padded to the alignment. Every file is written to a temporary name in the destination
folder, fsynced, and renamed into place only when complete, so an interrupted write leaves no destination.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from .constants import (
    DEFAULT_ALIGNMENT,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGML_QUANT_SIZES,
    GGUF_MAGIC,
    SCALAR_DTYPES,
    GGMLQuantizationType,
    GGUFValueType,
)
from .errors import GGUFError
from .file import split_path
from .reader import Field, tensor_nbytes

__all__ = ["GGUFWriter", "TensorData"]

TensorData = bytes | bytearray | memoryview | np.ndarray | Callable[[], Any]

_INT_RANGES = [
    (GGUFValueType.INT32, -(1 << 31), (1 << 31) - 1),
    (GGUFValueType.INT64, -(1 << 63), (1 << 63) - 1),
    (GGUFValueType.UINT64, 0, (1 << 64) - 1),
]


def _infer_type(value: Any) -> GGUFValueType:
    """gguf-py's inference: bool, int (int32, widened if needed), float32, str."""
    if isinstance(value, (bool, np.bool_)):
        return GGUFValueType.BOOL
    if isinstance(value, (int, np.integer)):
        for vtype, lo, hi in _INT_RANGES:
            if lo <= int(value) <= hi:
                return vtype
        raise GGUFError(f"integer {value} does not fit in 64 bits")
    if isinstance(value, (float, np.floating)):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    raise GGUFError(f"cannot infer a GGUF type for a value of type {type(value).__name__}")


_U64 = struct.Struct("<Q")


def _pack_string(out: io.BytesIO, s: str) -> None:
    raw = s.encode("utf-8")
    out.write(struct.pack("<Q", len(raw)))
    out.write(raw)


def _pack_scalar(out: io.BytesIO, vtype: GGUFValueType, value: Any, key: str) -> None:
    if vtype == GGUFValueType.STRING:
        if not isinstance(value, str):
            raise GGUFError(f"metadata {key!r}: expected a str for STRING, got {type(value).__name__}")
        _pack_string(out, value)
        return
    dtype = SCALAR_DTYPES[vtype]
    if vtype == GGUFValueType.BOOL:
        value = 1 if value else 0
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not isinstance(value, (int, np.integer)) or not info.min <= int(value) <= info.max:
            raise GGUFError(f"metadata {key!r}: {value!r} is not a valid {vtype.name}")
    out.write(np.asarray(value, dtype=dtype).tobytes())


@dataclass(slots=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    nbytes: int
    data: TensorData


class GGUFWriter:
    """Build a GGUF file: add metadata and tensors, then `finish()` (or leave the `with` block).

    Tensor data may be given as a buffer or as a zero-arg callable returning one; callables are called
    one at a time while writing, so a whole model never has to be in memory. With `split_max_tensors` or
    `split_max_size` (bytes of tensor data per shard) the model is written as `PREFIX-0000i-of-0000N.gguf`
    shards with llama.cpp's `split.*` keys.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        alignment: int = DEFAULT_ALIGNMENT,
        version: int = 3,
        split_max_tensors: int | None = None,
        split_max_size: int | None = None,
    ) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"alignment must be a power of two, got {alignment}")
        if version not in (2, 3):
            raise GGUFError(f"can write GGUF versions 2 and 3, not {version}")
        if split_max_tensors is not None and split_max_tensors < 1:
            raise GGUFError("split_max_tensors must be at least 1")
        if split_max_size is not None and split_max_size < 1:
            raise GGUFError("split_max_size must be at least 1 byte")
        self.path = os.fspath(path)
        self.alignment = alignment
        self.version = version
        self.split_max_tensors = split_max_tensors
        self.split_max_size = split_max_size
        self._fields: dict[str, Field] = {}
        self._tensors: dict[str, _Tensor] = {}
        self._done = False

    # -- building ---------------------------------------------------------------------------------------

    def add_metadata(
        self,
        key: str,
        value: Any,
        value_type: GGUFValueType | None = None,
        array_type: GGUFValueType | None = None,
    ) -> None:
        """Add one key. Types are inferred when not given (lists and arrays become ARRAY)."""
        if not isinstance(key, str) or not key:
            raise GGUFError(f"metadata key must be a non-empty str, got {key!r}")
        if key in self._fields:
            raise GGUFError(f"metadata key {key!r} was already added")
        if value_type is None:
            is_seq = isinstance(value, (list, tuple, np.ndarray))
            value_type = GGUFValueType.ARRAY if is_seq else _infer_type(value)
        if value_type == GGUFValueType.ARRAY:
            if array_type is None:
                if isinstance(value, np.ndarray) and value.dtype != object:
                    array_type = _array_type_of_dtype(value.dtype)
                else:
                    array_type = _infer_type(value[0]) if len(value) else GGUFValueType.INT32
            if array_type == GGUFValueType.ARRAY:
                raise GGUFError(f"metadata {key!r}: nested arrays are not supported")
        if key == "general.alignment":
            if value_type != GGUFValueType.UINT32 or int(value) <= 0 or int(value) & (int(value) - 1):
                raise GGUFError("general.alignment must be a uint32 power of two")
            self.alignment = int(value)
        self._fields[key] = Field(key, GGUFValueType(value_type), value, array_type)

    def add_field(self, field: Field) -> None:
        """Add a field read from another file, with its exact types."""
        self.add_metadata(field.name, field.value, field.value_type, field.array_type)

    def add_tensor(
        self, name: str, shape: Sequence[int], ggml_type: GGMLQuantizationType | int, data: TensorData
    ) -> None:
        """Declare a tensor (shape in ggml order, row length first); its bytes are written by `finish`."""
        if name in self._tensors:
            raise GGUFError(f"tensor {name!r} was already added")
        if not name or len(name.encode("utf-8")) >= GGML_MAX_NAME:
            raise GGUFError(f"tensor name {name!r} must be 1 to {GGML_MAX_NAME - 1} bytes long")
        try:
            gtype = GGMLQuantizationType(int(ggml_type))
        except ValueError:
            raise GGUFError(f"tensor {name!r}: unknown ggml type {ggml_type}") from None
        if gtype not in GGML_QUANT_SIZES:
            raise GGUFError(f"tensor {name!r}: ggml type {gtype.name} has no known block size")
        dims = tuple(int(d) for d in shape)
        if not 1 <= len(dims) <= GGML_MAX_DIMS or any(d < 0 for d in dims):
            raise GGUFError(f"tensor {name!r}: shape {list(dims)} must have 1 to 4 non-negative dimensions")
        try:
            nbytes = tensor_nbytes(gtype, dims)
        except GGUFError as e:
            raise GGUFError(f"tensor {name!r}: {e}") from None
        self._tensors[name] = _Tensor(name, dims, gtype, nbytes, data)

    # -- writing ----------------------------------------------------------------------------------------

    def _plan_shards(self) -> list[list[_Tensor]]:
        shards: list[list[_Tensor]] = [[]]
        size = 0
        for t in self._tensors.values():
            cur = shards[-1]
            full_count = self.split_max_tensors is not None and len(cur) >= self.split_max_tensors
            full_size = self.split_max_size is not None and cur and size + t.nbytes > self.split_max_size
            if full_count or full_size:
                shards.append([])
                size = 0
            shards[-1].append(t)
            size += t.nbytes
        return shards

    def _shard_fields(self, i: int, count: int) -> Iterable[Field]:
        if count == 1:
            yield from self._fields.values()
        else:
            if i == 0:
                yield from (f for k, f in self._fields.items() if not k.startswith("split."))
            yield Field("split.no", GGUFValueType.UINT16, i)
            yield Field("split.count", GGUFValueType.UINT16, count)
            yield Field("split.tensors.count", GGUFValueType.INT32, len(self._tensors))
        if self.alignment != DEFAULT_ALIGNMENT and "general.alignment" not in self._fields:
            yield Field("general.alignment", GGUFValueType.UINT32, self.alignment)

    def _header(self, fields: list[Field], tensors: list[_Tensor]) -> bytes:
        out = io.BytesIO()
        out.write(GGUF_MAGIC)
        out.write(struct.pack("<IQQ", self.version, len(tensors), len(fields)))
        for f in fields:
            _pack_string(out, f.name)
            out.write(struct.pack("<I", f.value_type))
            if f.value_type == GGUFValueType.ARRAY:
                assert f.array_type is not None
                items = f.value
                out.write(struct.pack("<IQ", f.array_type, len(items)))
                if f.array_type == GGUFValueType.STRING:  # vocabularies: tens of thousands, packed at once
                    parts = []
                    for s in items:
                        if not isinstance(s, str):
                            raise GGUFError(
                                f"metadata {f.name!r}: expected a str for STRING, got {type(s).__name__}"
                            )
                        raw = s.encode("utf-8")
                        parts.append(_U64.pack(len(raw)))
                        parts.append(raw)
                    out.write(b"".join(parts))
                else:
                    dtype = SCALAR_DTYPES[f.array_type]
                    arr = np.asarray(items)
                    if dtype.kind in "iu" and arr.size and arr.dtype.kind not in "iub":
                        raise GGUFError(f"metadata {f.name!r}: array items are not integers")
                    out.write(arr.astype(dtype, copy=False).tobytes())
            else:
                _pack_scalar(out, f.value_type, f.value, f.name)
        offset = 0
        for t in tensors:
            _pack_string(out, t.name)
            out.write(struct.pack("<I", len(t.shape)))
            out.write(struct.pack(f"<{len(t.shape)}Q", *t.shape))
            out.write(struct.pack("<IQ", t.ggml_type, offset))
            offset += _pad(t.nbytes, self.alignment)
        out.write(b"\0" * (_pad(out.tell(), self.alignment) - out.tell()))
        return out.getvalue()

    def _write_tensor(self, fh: BinaryIO, t: _Tensor) -> None:
        data = t.data() if callable(t.data) else t.data
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data)
        view = memoryview(data).cast("B")  # type: ignore[arg-type]
        if view.nbytes != t.nbytes:
            raise GGUFError(
                f"tensor {t.name!r}: got {view.nbytes} bytes of data, its type {t.ggml_type.name} and shape "
                f"{list(t.shape)} need {t.nbytes}"
            )
        fh.write(view)
        fh.write(b"\0" * (_pad(t.nbytes, self.alignment) - t.nbytes))

    def finish(self) -> list[str]:
        """Write every file atomically; returns the paths written. The writer cannot be reused."""
        if self._done:
            raise GGUFError("this GGUFWriter has already finished")
        self._done = True
        shards = self._plan_shards()
        count = len(shards)
        prefix = self.path.removesuffix(".gguf")
        finals = [self.path] if count == 1 else [split_path(prefix, i, count) for i in range(count)]
        temps: list[str] = []
        try:
            for i, tensors in enumerate(shards):
                temps.append(self._write_one(finals[i], list(self._shard_fields(i, count)), tensors))
            for tmp, final in zip(temps, finals, strict=True):
                os.replace(tmp, final)
            _fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        except BaseException:
            for tmp in temps:
                _remove_quietly(tmp)
            raise
        return finals

    def _write_one(self, final: str, fields: list[Field], tensors: list[_Tensor]) -> str:
        folder = os.path.dirname(os.path.abspath(final))
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(final)}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(self._header(fields, tensors))
                for t in tensors:
                    self._write_tensor(fh, t)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            _remove_quietly(tmp)
            raise
        return tmp

    def __enter__(self) -> GGUFWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None and not self._done:
            self.finish()
        self._done = True


def _array_type_of_dtype(dtype: np.dtype) -> GGUFValueType:
    for vtype, dt in SCALAR_DTYPES.items():
        if vtype != GGUFValueType.BOOL and dt == dtype.newbyteorder("<"):
            return vtype
    if dtype == np.bool_:
        return GGUFValueType.BOOL
    raise GGUFError(f"no GGUF array type for numpy dtype {dtype}")


def _pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)
