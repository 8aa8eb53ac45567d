"""Slot state files: one sequence's tokens and KV cells, saved to disk and read back.

llama.cpp's `llama_state_seq_save_file` counterpart, in this engine's own format (little-endian):

    magic    8 bytes   b"LLPYSEQ\\0"
    version  u32       FORMAT_VERSION
    hlen     u32       length of the JSON header
    header   hlen      {"fingerprint": {...}, "n_tokens": N, "kv_dim": D, "dtype": [K, V],
                        "pools": [{"layers": [...], "window": W | null, "n_cells": n}, ...]}
    tokens   int32 [N]
    per pool: pos int32 [n], k [n_layers, n, D], v [n_layers, n, D] (f16 or f32, the cache's types K, V)
              a recurrent pool (its layers are the fingerprint's "recurrent" ones): n is 0 or 1, its
              state at position pos, k the conv states [n_layers, n, R] and v the SSM states
              [n_layers, n, S], float32 (R, S: the fingerprint's "rows")
    crc32    u32       of everything between the magic and the crc (header and payload)

The fingerprint names the model (architecture, sizes, KV layout and type, tokenizer and weight hashes): a
file is only restored into the model that wrote it. Reading checks the magic, the version, the fingerprint,
every length against the file size and the checksum before anything reaches the KV cache. Writing is
atomic (temporary file, fsync, rename): a reader never sees half a file.

A file is named by a request, inside a directory the operator chose: the name is opened relative to that
directory and never followed when it is a symbolic link (at the name or at the temporary file), only
regular files are read (a FIFO or a device never blocks or streams forever), and a reader gives a bound on
the bytes it takes (`state_size_bound`: the largest file a slot of this model can hold), checked before
reading and enforced while reading.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import struct
import zlib
from collections.abc import Iterable
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
    "state_size_bound",
    "write_state",
]

MAGIC = b"LLPYSEQ\0"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")
_CRC = struct.Struct("<I")
_MAX_HEADER = 1 << 20
_READ_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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
    gguf: Any,
    config: Any,
    kv_dim: int,
    type_k: str = "f16",
    type_v: str = "f16",
    recurrent: tuple[list[int], int, int] | None = None,
    state_layout: str | None = None,
) -> dict[str, Any]:
    """What must match between the writer and the reader of a state file; ``recurrent``: the layers of
    the memory's recurrent pool and its conv and SSM state widths, where the model has one, and
    ``state_layout`` the order of the state's values where it is not ggml's."""
    tok = gguf.tokenizer
    h = hashlib.sha256()
    for t in tok.tokens:
        h.update(t.encode("utf-8", "surrogatepass") + b"\0")
    w = hashlib.sha256()
    for name in ("token_embd.weight", "output_norm.weight"):
        if name in gguf.tensors:
            raw = gguf.tensor_bytes(name)
            w.update(name.encode() + bytes(raw[: 1 << 20]))
    fp = {
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
    if recurrent is not None:
        layers, r_dim, s_dim = recurrent
        fp["recurrent"] = {"layers": [int(i) for i in layers], "rows": [int(r_dim), int(s_dim)]}
        if state_layout is not None:
            fp["recurrent"]["layout"] = state_layout
    return fp


def write_state(path: str | os.PathLike[str], fingerprint: dict[str, Any], state: SeqState) -> int:
    """Write `state` atomically; returns the number of bytes written. A symbolic link at `path` is
    replaced, never followed."""
    pools_meta = [(p.layers, p.window, len(p.pos)) for p in state.pools]
    hbytes = _header_bytes(fingerprint, state.n_tokens, pools_meta)
    chunks: list[bytes | memoryview] = [hbytes, _le(state.tokens, "<i4")]
    for p in state.pools:
        (kt, _), (vt, _) = _pool_rows(fingerprint, p.layers)
        chunks += [_le(p.pos, "<i4"), _le(p.k, kt), _le(p.v, vt)]
    return _write_atomic(Path(path), _PREFIX.pack(MAGIC, FORMAT_VERSION, len(hbytes)), chunks)


def state_size_bound(
    fingerprint: dict[str, Any], pool_layout: list[tuple[list[int], int | None]], n_ctx: int
) -> int:
    """The size in bytes of the largest state file `write_state` gives for this model and cache layout
    when a sequence holds at most `n_ctx` tokens (every pool then holds at most `n_ctx` cells)."""
    pools_meta = [(layers, window, n_ctx) for layers, window in pool_layout]
    hlen = len(_header_bytes(fingerprint, n_ctx, pools_meta))  # the widest numbers: the longest header
    # a recurrent pool holds one state whatever the length
    pools_meta = [(ls, w, 1 if _is_recurrent(fingerprint, ls) else n) for ls, w, n in pools_meta]
    return _PREFIX.size + _content_size(hlen, n_ctx, pools_meta, fingerprint) + _CRC.size


def _header_bytes(
    fingerprint: dict[str, Any], n_tokens: int, pools_meta: list[tuple[list[int], int | None, int]]
) -> bytes:
    header = {
        "fingerprint": fingerprint,
        "n_tokens": n_tokens,
        "kv_dim": int(fingerprint["kv_dim"]),
        "dtype": list(fingerprint["kv_type"]),
        "pools": [{"layers": layers, "window": window, "n_cells": n} for layers, window, n in pools_meta],
    }
    return json.dumps(header, sort_keys=True).encode()


def _content_size(
    hlen: int,
    n_tokens: int,
    pools_meta: Iterable[tuple[list[int], int | None, int]],
    fingerprint: dict[str, Any],
) -> int:
    """Bytes between the prefix and the crc: header, tokens, then per pool positions, keys and values."""
    total = hlen + 4 * n_tokens
    for layers, _, n in pools_meta:
        (kt, kw), (vt, vw) = _pool_rows(fingerprint, layers)
        total += 4 * n + (int(kt[-1]) * kw + int(vt[-1]) * vw) * len(layers) * n
    return total


def _is_recurrent(fingerprint: dict[str, Any], layers: list[int]) -> bool:
    rec = fingerprint.get("recurrent")
    return isinstance(rec, dict) and rec.get("layers") == list(layers)


def _pool_rows(fingerprint: dict[str, Any], layers: list[int]) -> tuple[tuple[str, int], tuple[str, int]]:
    """(element type, elements per row) of a pool's k and v rows in a file: the KV cache's types, or
    float32 conv and SSM state rows for the recurrent pool."""
    if _is_recurrent(fingerprint, layers):
        r_dim, s_dim = fingerprint["recurrent"]["rows"]
        return ("<f4", int(r_dim)), ("<f4", int(s_dim))
    kv_dim = int(fingerprint["kv_dim"])
    k, v = (_layout(t, kv_dim) for t in fingerprint["kv_type"])
    return k, v


def _write_atomic(path: Path, prefix: bytes, chunks: list[bytes | memoryview]) -> int:
    """Write `prefix`, `chunks` and their crc to a new temporary file beside `path`, then rename it over
    `path`; both names are taken relative to the directory, opened once."""
    crc = 0
    for c in chunks:
        crc = zlib.crc32(c, crc)
    tmp = f".slot-{os.getpid()}-{os.urandom(6).hex()}.tmp"  # not derived from the name: a long one fits
    dfd = os.open(os.path.realpath(path.parent), _DIR_FLAGS)
    try:
        n = 0
        try:
            # O_EXCL | O_NOFOLLOW: a file or link planted at the temporary name is an error, never written
            with os.fdopen(os.open(tmp, _WRITE_FLAGS, 0o600, dir_fd=dfd), "wb") as f:
                for c in [prefix, *chunks]:
                    n += f.write(c)
                n += f.write(_CRC.pack(crc))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)  # replaces a link, not its target
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        with contextlib.suppress(OSError):  # make the rename itself durable
            os.fsync(dfd)
    finally:
        os.close(dfd)
    return n


def read_state(
    path: str | os.PathLike[str],
    fingerprint: dict[str, Any],
    pool_layout: list[tuple[list[int], int | None]],
    max_bytes: int | None = None,
) -> tuple[SeqState, int]:
    """Read and check a state file written for this model; returns the state and the bytes read.

    `pool_layout` is this cache's (layers, window) per pool, in order. The last component of `path` must
    be a regular file, not a symbolic link; a file larger than `max_bytes` is refused unread. Raises
    StateFileError with the reason when the file cannot be restored.
    """
    data = _read_file(Path(path), max_bytes)
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
        if not isinstance(their, dict):
            raise TypeError("the fingerprint is not an object")
    # OverflowError: a number such as 1e400 (infinite) where an integer belongs; RecursionError: a header
    # nested deeper than the parser's stack
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as e:
        raise StateFileError(f"corrupt file: bad header ({type(e).__name__}: {e})"[:300]) from None
    if their.get("kv_type") != fingerprint["kv_type"]:
        theirs, ours = "/".join(map(str, their.get("kv_type") or ())), "/".join(fingerprint["kv_type"])
        raise StateFileError(f"the file holds a {theirs} (K/V) KV cache, this server's cache is {ours}")
    if their != fingerprint:
        diff = sorted(k for k in set(their) | set(fingerprint) if their.get(k) != fingerprint.get(k))
        raise StateFileError(f"the file was saved from another model (differs in {', '.join(diff)})")
    if dtype != list(fingerprint["kv_type"]) or kv_dim != fingerprint["kv_dim"]:
        raise StateFileError("unsupported KV type or size in the file")
    if [(layers, window) for layers, window, _ in pools_meta] != pool_layout:
        raise StateFileError("the file's KV cache layout differs from this model's")
    if any(_is_recurrent(fingerprint, layers) and n > 1 for layers, _, n in pools_meta):
        raise StateFileError("corrupt file: a recurrent state of more than one row")
    expect = _content_size(hlen, n_tokens, pools_meta, fingerprint)
    if n_tokens < 0 or any(n < 0 for _, _, n in pools_meta) or expect != len(body):
        raise StateFileError(f"corrupt file: {len(body)} bytes of content, the header describes {expect}")
    off = hlen
    tokens, off = _take(body, off, "<i4", (n_tokens,))
    pools = []
    for layers, window, n in pools_meta:
        (kt, kw), (vt, vw) = _pool_rows(fingerprint, layers)
        pos, off = _take(body, off, "<i4", (n,))
        k, off = _take(body, off, kt, (len(layers), n, kw))
        v, off = _take(body, off, vt, (len(layers), n, vw))
        pools.append(PoolState(layers, window, pos, k, v))
    state = SeqState(tokens, pools)
    _check(state, fingerprint)
    return state, len(data)


def _read_file(path: Path, max_bytes: int | None) -> bytearray:
    """The bytes of the regular file `path.name` in `path.parent`, at most `max_bytes` of them."""
    try:
        dfd = os.open(os.path.realpath(path.parent), _DIR_FLAGS)
    except OSError as e:
        raise StateFileError(f"cannot open the directory: {e.strerror or e}") from None
    try:
        fd = os.open(path.name, _READ_FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        raise StateFileError("file not found") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StateFileError("the file is a symbolic link") from None
        raise StateFileError(f"cannot read the file: {e.strerror or e}") from None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)  # the opened file itself: no window between the check and the read
        if not stat.S_ISREG(st.st_mode):
            raise StateFileError("not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise _too_large(f"{st.st_size} bytes", max_bytes)
        return _read_at_most(fd, max_bytes)
    finally:
        os.close(fd)


def _read_at_most(fd: int, max_bytes: int | None) -> bytearray:
    data = bytearray()
    try:
        while chunk := os.read(fd, _READ_CHUNK):
            data += chunk
            if max_bytes is not None and len(data) > max_bytes:  # it grew since fstat
                raise _too_large(f"{len(data)} bytes or more", max_bytes)
    except OSError as e:
        raise StateFileError(f"cannot read the file: {e.strerror or e}") from None
    return data


def _too_large(size: str, max_bytes: int) -> StateFileError:
    return StateFileError(
        f"the file ({size}) holds more than the context of a slot can (at most {max_bytes} bytes)"
    )


def _check(state: SeqState, fingerprint: dict[str, Any]) -> None:
    n = state.n_tokens
    if n and (int(state.tokens.min()) < 0 or int(state.tokens.max()) >= int(fingerprint["n_vocab"])):
        raise StateFileError("corrupt file: token ids outside the vocabulary")
    for p in state.pools:
        if len(p.pos) and (np.any(np.diff(p.pos) <= 0) or p.pos[0] < 0 or p.pos[-1] >= n):
            raise StateFileError("corrupt file: cell positions out of order or out of range")
        if _is_recurrent(fingerprint, p.layers):
            if len(p.pos) and p.pos[0] != n - 1:  # the state absorbed every token
                raise StateFileError("corrupt file: the recurrent state is not at the last token")
        elif p.window is None and not np.array_equal(p.pos, np.arange(n, dtype=np.int32)):
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
