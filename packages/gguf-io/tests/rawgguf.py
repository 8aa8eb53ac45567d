"""Assemble GGUF files byte by byte, so tests can corrupt any single part of one."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path


def pack_str(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


@dataclass
class RawGGUF:
    """A GGUF file assembled field by field, so tests can corrupt any single part of it.

    `kvs` holds already-encoded (key, type, payload) triples; `tensors` holds (name, dims, type, offset).
    """

    version: int = 3
    kvs: list[tuple[bytes, int, bytes]] = field(default_factory=list)
    tensors: list[tuple[bytes, list[int], int, int]] = field(default_factory=list)
    alignment: int = 32
    data: bytes = b""
    n_tensors: int | None = None
    n_kv: int | None = None
    magic: bytes = b"GGUF"

    def kv_u32(self, key: str, v: int) -> RawGGUF:
        self.kvs.append((key.encode(), 4, struct.pack("<I", v)))
        return self

    def kv_str(self, key: str, v: str | bytes) -> RawGGUF:
        self.kvs.append((key.encode() if isinstance(key, str) else key, 8, pack_str(v)))
        return self

    def kv_raw(self, key: str | bytes, vtype: int, payload: bytes) -> RawGGUF:
        self.kvs.append((key.encode() if isinstance(key, str) else key, vtype, payload))
        return self

    def tensor(self, name: str | bytes, dims: list[int], ggml_type: int = 0, offset: int = 0) -> RawGGUF:
        self.tensors.append((name.encode() if isinstance(name, str) else name, dims, ggml_type, offset))
        return self

    def header(self) -> bytes:
        out = bytearray(self.magic)
        out += struct.pack("<I", self.version)
        out += struct.pack(
            "<QQ",
            len(self.tensors) if self.n_tensors is None else self.n_tensors,
            len(self.kvs) if self.n_kv is None else self.n_kv,
        )
        for key, vtype, payload in self.kvs:
            out += pack_str(key) + struct.pack("<I", vtype) + payload
        for name, dims, gtype, off in self.tensors:
            out += pack_str(name) + struct.pack("<I", len(dims))
            out += b"".join(struct.pack("<Q", d) for d in dims)
            out += struct.pack("<IQ", gtype, off)
        return bytes(out)

    def build(self) -> bytes:
        out = self.header()
        pad = -len(out) % self.alignment
        return out + b"\0" * pad + self.data

    def write(self, path: Path) -> Path:
        path.write_bytes(self.build())
        return path


def minimal_model() -> RawGGUF:
    """A valid tiny model: two F32 tensors of 8 floats and the keys a ModelHeader needs."""
    g = RawGGUF()
    g.kv_str("general.architecture", "llama")
    g.kv_u32("llama.block_count", 1).kv_u32("llama.context_length", 64)
    g.kv_u32("llama.embedding_length", 8).kv_u32("llama.attention.head_count", 2)
    g.tensor("a", [8], 0, 0).tensor("b", [8], 0, 32)
    g.data = bytes(range(32)) + bytes(range(32, 64))
    return g
