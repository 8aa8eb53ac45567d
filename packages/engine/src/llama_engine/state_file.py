"""Slot state files: one sequence's tokens and KV cells, saved to disk and read back.

llama.cpp's `llama_state_seq_save_file` counterpart, in this engine's own format (little-endian):

    magic    8 bytes   b"LLPYSEQ\\0"
    version  u32       FORMAT_VERSION
    hlen     u32       length of the JSON header
    header   hlen      {"fingerprint": {...}, "n_tokens": N, "kv_dim": D, "dtype": [K, V],
                        "pools": [{"layers": [...], "window": W | null, "n_cells": n}, ...]}
    tokens   int32 [N]
    per pool: pos int32 [n], k [n_layers, n, D], v [n_layers, n, D] (f16 or f32, the cache's types K, V)
    crc32    u32       of everything between the magic and the crc (header and payload)

The fingerprint names the model (architecture, sizes, KV layout and type, tokenizer and weight hashes): a
file is only restored into the model that wrote it. Reading checks the magic, the version, the fingerprint,
every length against the file size and the checksum before anything reaches the KV cache. Writing is
atomic (temporary file, fsync, rename): a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .kv_types import kv_type

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "PoolState",
    "SeqState",
    "StateFileError",
    "model_fingerprint",
    "read_state",
    "write_state",
]

MAGIC = b"LLPYSEQ\0"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")
_CRC = struct.Struct("<I")
_MAX_HEADER = 1 << 20


class StateFileError(ValueError):
    """A state file that cannot be restored here: missing, corrupt, or written by another model."""


@dataclass(slots=True)
class PoolState:
    """One cell pool's share of a sequence: positions and, per layer of the pool, keys and values."""

    layers: list[int]
    window: int | None
    pos: np.ndarray  # int32 [n], increasing
    k: np.ndarray  # [n_layers, n, kv_dim], the cache's key type
    v: np.ndarray  # [n_layers, n, kv_dim], the cache's value type


@dataclass(slots=True)
class SeqState:
    """What a slot holds: its tokens (position i holds tokens[i]) and its cells in every pool."""

    tokens: np.ndarray  # int32 [n_tokens]
    pools: list[PoolState]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def model_fingerprint(
    gguf: Any, config: Any, kv_dim: int, type_k: str = "f16", type_v: str = "f16"
) -> dict[str, Any]:
    """What must match between the writer and the reader of a state file."""
    tok = gguf.tokenizer
    h = hashlib.sha256()
    for t in tok.tokens:
        h.update(t.encode("utf-8", "surrogatepass") + b"\0")
    w = hashlib.sha256()
    for name in ("token_embd.weight", "output_norm.weight"):
        if name in gguf.tensors:
            raw = gguf.tensor_bytes(name)
            w.update(name.encode() + bytes(raw[: 1 << 20]))
    return {
        "architecture": gguf.header.architecture,
        "n_layer": int(config.n_layer),
        "n_embd": int(config.n_embd),
        "n_vocab": int(config.n_vocab),
        "kv_dim": int(kv_dim),
        "kv_type": [type_k, type_v],
        "swa_layers": sorted(int(i) for i in config.swa_layers),
        "swa_window": config.swa_window,
        "tokenizer_sha256": h.hexdigest(),
        "weights_sha256": w.hexdigest(),
    }


def write_state(path: str | os.PathLike[str], fingerprint: dict[str, Any], state: SeqState) -> int:
    """Write `state` atomically; returns the number of bytes written."""
    kv_dim = int(fingerprint["kv_dim"])
    header = {
        "fingerprint": fingerprint,
        "n_tokens": state.n_tokens,
        "kv_dim": kv_dim,
        "dtype": list(fingerprint["kv_type"]),
        "pools": [{"layers": p.layers, "window": p.window, "n_cells": len(p.pos)} for p in state.pools],
    }
    hbytes = json.dumps(header, sort_keys=True).encode()
    chunks: list[bytes | memoryview] = [hbytes, _le(state.tokens, "<i4")]
    (kt, _), (vt, _) = (_layout(t, kv_dim) for t in fingerprint["kv_type"])
    for p in state.pools:
        chunks += [_le(p.pos, "<i4"), _le(p.k, kt), _le(p.v, vt)]
    crc = 0
    for c in chunks:
        crc = zlib.crc32(c, crc)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    n = 0
    try:
        with open(tmp, "wb") as f:
            n += f.write(_PREFIX.pack(MAGIC, FORMAT_VERSION, len(hbytes)))
            for c in chunks:
                n += f.write(c)
            n += f.write(_CRC.pack(crc))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return n


def read_state(
    path: str | os.PathLike[str], fingerprint: dict[str, Any], pool_layout: list[tuple[list[int], int | None]]
) -> tuple[SeqState, int]:
    """Read and check a state file written for this model; returns the state and the bytes read.

    `pool_layout` is this cache's (layers, window) per pool, in order. Raises StateFileError with the
    reason when the file cannot be restored.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise StateFileError("file not found") from None
    except OSError as e:
        raise StateFileError(f"cannot read the file: {e.strerror or e}") from None
    if len(data) < _PREFIX.size + _CRC.size:
        raise StateFileError("the file is too short to be a slot state file")
    magic, version, hlen = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise StateFileError("not a slot state file (bad magic)")
    if version != FORMAT_VERSION:
        raise StateFileError(f"unsupported slot state file version {version} (expected {FORMAT_VERSION})")
    if hlen > min(_MAX_HEADER, len(data) - _PREFIX.size - _CRC.size):
        raise StateFileError("corrupt file: header length out of range")
    body = memoryview(data)[_PREFIX.size : len(data) - _CRC.size]
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if zlib.crc32(body) != crc:
        raise StateFileError("corrupt file: checksum mismatch")
    try:
        header = json.loads(bytes(body[:hlen]))
        their = header["fingerprint"]
        n_tokens = int(header["n_tokens"])
        kv_dim = int(header["kv_dim"])
        pools_meta = [(list(map(int, p["layers"])), p["window"], int(p["n_cells"])) for p in header["pools"]]
        dtype = header["dtype"]
    except (ValueError, KeyError, TypeError) as e:
        raise StateFileError(f"corrupt file: bad header ({e})") from None
    if isinstance(their, dict) and their.get("kv_type") != fingerprint["kv_type"]:
        theirs, ours = "/".join(map(str, their.get("kv_type") or ())), "/".join(fingerprint["kv_type"])
        raise StateFileError(f"the file holds a {theirs} (K/V) KV cache, this server's cache is {ours}")
    if their != fingerprint:
        diff = sorted(k for k in set(their) | set(fingerprint) if their.get(k) != fingerprint.get(k))
        raise StateFileError(f"the file was saved from another model (differs in {', '.join(diff)})")
    if dtype != list(fingerprint["kv_type"]) or kv_dim != fingerprint["kv_dim"]:
        raise StateFileError("unsupported KV type or size in the file")
    (kt, kw), (vt, vw) = (_layout(t, kv_dim) for t in dtype)
    kb, vb = int(kt[-1]) * kw, int(vt[-1]) * vw
    if [(layers, window) for layers, window, _ in pools_meta] != pool_layout:
        raise StateFileError("the file's KV cache layout differs from this model's")
    expect = hlen + 4 * n_tokens + sum(4 * n + (kb + vb) * len(layers) * n for layers, _, n in pools_meta)
    if n_tokens < 0 or any(n < 0 for _, _, n in pools_meta) or expect != len(body):
        raise StateFileError(f"corrupt file: {len(body)} bytes of content, the header describes {expect}")
    off = hlen
    tokens, off = _take(body, off, "<i4", (n_tokens,))
    pools = []
    for layers, window, n in pools_meta:
        pos, off = _take(body, off, "<i4", (n,))
        k, off = _take(body, off, kt, (len(layers), n, kw))
        v, off = _take(body, off, vt, (len(layers), n, vw))
        pools.append(PoolState(layers, window, pos, k, v))
    state = SeqState(tokens, pools)
    _check(state, fingerprint)
    return state, len(data)


def _check(state: SeqState, fingerprint: dict[str, Any]) -> None:
    n = state.n_tokens
    if n and (int(state.tokens.min()) < 0 or int(state.tokens.max()) >= int(fingerprint["n_vocab"])):
        raise StateFileError("corrupt file: token ids outside the vocabulary")
    for p in state.pools:
        if len(p.pos) and (np.any(np.diff(p.pos) <= 0) or p.pos[0] < 0 or p.pos[-1] >= n):
            raise StateFileError("corrupt file: cell positions out of order or out of range")
        if p.window is None and not np.array_equal(p.pos, np.arange(n, dtype=np.int32)):
            raise StateFileError("corrupt file: the full-attention cells do not cover every token")
        floats = [a for a in (p.k, p.v) if a.dtype.kind == "f"]  # ggml block bytes carry no NaN check
        if not all(np.isfinite(a).all() for a in floats):
            raise StateFileError("corrupt file: non-finite keys or values")


# little-endian element types of the cache types in files; the others are ggml's row bytes
_ELEMENT = {"f32": "<f4", "f16": "<f2"}


def _layout(name: str, kv_dim: int) -> tuple[str, int]:
    """(element type, elements per cache row) of a cache type in a file."""
    if name in _ELEMENT:
        return _ELEMENT[name], kv_dim
    try:
        return "|u1", kv_type(name).row_bytes(kv_dim)
    except ValueError:
        raise StateFileError(f"unsupported KV type {name!r} in the file") from None


def _le(a: np.ndarray, dtype: str) -> memoryview:
    return memoryview(np.ascontiguousarray(a, dtype=dtype).reshape(-1).view(np.uint8).data)


def _take(buf: memoryview, off: int, dtype: str, shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    count = int(np.prod(shape))
    a = np.frombuffer(buf, dtype=dtype, count=count, offset=off).reshape(shape)
    return a.astype(dtype[1:], copy=True), off + a.nbytes
