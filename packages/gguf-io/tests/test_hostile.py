"""Hand-made hostile files, one per failure class: each is rejected with GGUFError, quickly, without
allocating more than a small multiple of its own size, and with a message that names the problem."""

from __future__ import annotations

import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from rawgguf import RawGGUF, minimal_model, pack_str

import gguf_io

U64_MAX = (1 << 64) - 1


def touch_everything(path: Path) -> None:
    """Everything a consumer might read: open, metadata, typed views, every tensor's bytes."""
    with gguf_io.open(path) as f:
        _ = f.metadata
        _ = f.header
        if "tokenizer.ggml.model" in f.fields:
            _ = f.tokenizer
        for name in f.tensors:
            f.tensor_bytes(name).sum()


def _truncate(n: int) -> Callable[[], bytes]:
    return lambda: minimal_model().build()[:n]


def _model(**changes: object) -> Callable[[], bytes]:
    def build() -> bytes:
        g = minimal_model()
        for k, v in changes.items():
            setattr(g, k, v)
        return g.build()

    return build


def _with(edit: Callable[[RawGGUF], object]) -> Callable[[], bytes]:
    def build() -> bytes:
        g = minimal_model()
        edit(g)
        return g.build()

    return build


def _tokenizer(edit: Callable[[RawGGUF], object]) -> Callable[[], bytes]:
    def build() -> bytes:
        g = minimal_model()
        g.kv_str("tokenizer.ggml.model", "gpt2")
        g.kv_raw("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + pack_str("a") + pack_str("b"))
        edit(g)
        return g.build()

    return build


def _patch_u64(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + struct.pack("<Q", value) + data[at + 8 :]


def _array(item_type: int, count: int, payload: bytes = b"") -> bytes:
    return struct.pack("<IQ", item_type, count) + payload


def _replace_tensor(i: int, **kw: object) -> Callable[[RawGGUF], None]:
    def edit(g: RawGGUF) -> None:
        name, dims, gtype, off = g.tensors[i]
        g.tensors[i] = (
            kw.get("name", name),  # type: ignore[arg-type]
            kw.get("dims", dims),  # type: ignore[arg-type]
            kw.get("gtype", gtype),  # type: ignore[arg-type]
            kw.get("off", off),  # type: ignore[arg-type]
        )

    return edit


# (case id, file bytes, a fragment the error message must contain)
CASES: list[tuple[str, Callable[[], bytes], str]] = [
    ("empty-file", lambda: b"", "truncated"),
    ("bad-magic", lambda: b"GGML" + minimal_model().build()[4:], "not a GGUF file"),
    ("truncated-magic", _truncate(2), "truncated"),
    ("truncated-version", _truncate(6), "truncated"),
    ("truncated-tensor-count", _truncate(12), "tensor count"),
    ("truncated-kv-count", _truncate(20), "metadata count"),
    ("truncated-in-first-key", _truncate(30), "truncated"),
    ("truncated-in-tensor-table", lambda: minimal_model().header()[:-5], "truncated"),
    ("truncated-before-data", lambda: minimal_model().build()[:-40], "past the end"),
    ("version-1", _model(version=1), "version 1"),
    ("version-unknown", _model(version=99), "unsupported GGUF version"),
    ("big-endian", lambda: b"GGUF" + struct.pack(">I", 3) + minimal_model().build()[8:], "big-endian"),
    ("huge-kv-count", _model(n_kv=1 << 63), "metadata count"),
    ("huge-tensor-count", _model(n_tensors=1 << 62), "tensor count"),
    ("kv-count-too-high", _model(n_kv=9), "metadata entry 7"),
    ("huge-key-length", _with(lambda g: g.kvs.insert(0, (b"x" * 70000, 4, b"\0" * 4))), "limit"),
    ("key-length-past-eof", lambda: _patch_u64(minimal_model().build(), 24, 60000), "truncated"),
    ("key-bad-utf8", _with(lambda g: g.kv_u32("ok", 1).kvs.append((b"\xff\xfe", 4, b"\0" * 4))), "UTF-8"),
    ("duplicate-key", _with(lambda g: g.kv_u32("llama.block_count", 2)), "appears twice"),
    ("unknown-value-type", _with(lambda g: g.kv_raw("k", 99, b"\0" * 8)), "unknown value type"),
    ("string-length-huge", _with(lambda g: g.kv_raw("k", 8, struct.pack("<Q", 1 << 62))), "truncated"),
    ("string-bad-utf8", _with(lambda g: g.kv_str("k", b"ab\xc3\x28")), "UTF-8"),
    ("array-count-2^63", _with(lambda g: g.kv_raw("k", 9, _array(0, 1 << 63))), "limit"),
    ("array-count-past-eof", _with(lambda g: g.kv_raw("k", 9, _array(4, 1 << 20))), "truncated"),
    ("array-of-strings-count-huge", _with(lambda g: g.kv_raw("k", 9, _array(8, 1 << 30))), "truncated"),
    ("nested-array", _with(lambda g: g.kv_raw("k", 9, _array(9, 1, _array(0, 1, b"\1")))), "nested"),
    (
        "array-unknown-item-type",
        _with(lambda g: g.kv_raw("k", 9, _array(77, 1, b"\0"))),
        "unknown value type",
    ),
    (
        "string-array-item-past-eof",
        _with(lambda g: g.kv_raw("k", 9, _array(8, 2, pack_str("a") + struct.pack("<Q", 1 << 40)))),
        "truncated",
    ),
    ("string-array-bad-utf8", _with(lambda g: g.kv_raw("k", 9, _array(8, 1, pack_str(b"\x80")))), "UTF-8"),
    ("bool-not-0-or-1", _with(lambda g: g.kv_raw("k", 7, b"\x02")), "bool"),
    ("bool-array-not-0-or-1", _with(lambda g: g.kv_raw("k", 9, _array(7, 2, b"\x01\x05"))), "bool"),
    ("alignment-wrong-type", _with(lambda g: g.kv_str("general.alignment", "32")), "uint32"),
    ("alignment-zero", _with(lambda g: g.kv_u32("general.alignment", 0)), "power of two"),
    ("alignment-not-power-of-2", _with(lambda g: g.kv_u32("general.alignment", 48)), "power of two"),
    ("tensor-name-too-long", _with(_replace_tensor(0, name=b"n" * 64)), "limit"),
    ("tensor-name-bad-utf8", _with(_replace_tensor(0, name=b"\xc0\xaf")), "UTF-8"),
    ("duplicate-tensor-name", _with(_replace_tensor(1, name=b"a")), "appears twice"),
    ("zero-dims", _with(_replace_tensor(0, dims=[])), "dimensions"),
    ("five-dims", _with(_replace_tensor(0, dims=[1, 1, 1, 1, 8])), "dimensions"),
    ("dims-product-wraps", _with(_replace_tensor(0, dims=[1 << 32, 1 << 32])), "overflows"),
    ("dim-2^63", _with(_replace_tensor(0, dims=[1 << 63])), "overflows"),
    ("unknown-ggml-type", _with(_replace_tensor(0, gtype=99)), "unknown ggml type"),
    ("removed-ggml-type-q4_2", _with(_replace_tensor(0, gtype=4)), "unknown ggml type"),
    ("row-not-whole-blocks", _with(_replace_tensor(0, dims=[33], gtype=2)), "block size"),
    ("offset-unaligned", _with(_replace_tensor(1, off=33)), "alignment"),
    ("offset-past-eof", _with(_replace_tensor(1, off=1 << 40)), "past the end"),
    ("offset-wraps-u64", _with(_replace_tensor(1, off=U64_MAX - 31)), "past the end"),
    ("size-past-eof", _with(_replace_tensor(1, dims=[1 << 30])), "past the end"),
    ("overlapping-tensors", _with(_replace_tensor(1, off=0)), "overlaps"),
    ("tensors-out-of-order", _with(lambda g: g.tensors.reverse()), "overlaps"),
    ("arch-missing", _with(lambda g: g.kvs.pop(0)), "general.architecture"),
    (
        "arch-not-a-string",
        _with(lambda g: g.kvs.__setitem__(0, (b"general.architecture", 4, b"\0" * 4))),
        "string",
    ),
    (
        "block-count-mistyped",
        _with(lambda g: g.kvs.__setitem__(1, (b"llama.block_count", 8, pack_str("1")))),
        "integer",
    ),
    (
        "block-count-zero",
        _with(lambda g: g.kvs.__setitem__(1, (b"llama.block_count", 4, b"\0" * 4))),
        "range",
    ),
    (
        "block-count-huge",
        _with(lambda g: g.kvs.__setitem__(1, (b"llama.block_count", 4, b"\xff" * 4))),
        "range",
    ),
    (
        "head-count-zero-no-key-length",
        _with(lambda g: g.kvs.__setitem__(4, (b"llama.attention.head_count", 4, b"\0" * 4))),
        "key_length",
    ),
    (
        "rope-base-nan",
        _with(lambda g: g.kv_raw("llama.rope.freq_base", 6, struct.pack("<f", float("nan")))),
        "finite",
    ),
    (
        "tokens-mistyped",
        _tokenizer(lambda g: g.kvs.__setitem__(-1, (b"tokenizer.ggml.tokens", 9, _array(4, 1, b"\0" * 4)))),
        "array of strings",
    ),
    (
        "scores-as-uint8",
        _tokenizer(lambda g: g.kv_raw("tokenizer.ggml.scores", 9, _array(0, 2, b"\1\2"))),
        "float32",
    ),
    (
        "scores-wrong-length",
        _tokenizer(lambda g: g.kv_raw("tokenizer.ggml.scores", 9, _array(6, 1, b"\0" * 4))),
        "entries",
    ),
    (
        "token-id-out-of-range",
        _tokenizer(lambda g: g.kv_u32("tokenizer.ggml.eos_token_id", 2)),
        "outside the vocabulary",
    ),
    (
        "split-count-without-shards",
        _with(lambda g: g.kv_raw("split.count", 2, struct.pack("<H", 3))),
        "pattern",
    ),
]


@pytest.mark.parametrize(("case", "build", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_hostile_file_is_rejected(
    case: str, build: Callable[[], bytes], fragment: str, tmp_path: Path
) -> None:
    path = tmp_path / f"{case}.gguf"
    data = build()
    path.write_bytes(data)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(gguf_io.GGUFError) as info:
            touch_everything(path)
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fragment in str(info.value), str(info.value)
    assert str(path) in str(info.value)
    assert elapsed < 1.0
    assert peak < 256 * 1024 + 4 * len(data), f"peak {peak} bytes for a {len(data)}-byte file"


def test_the_minimal_model_itself_is_valid(tmp_path: Path) -> None:
    """Guards the hostile cases: each differs from a file that opens cleanly by one defect."""
    path = minimal_model().write(tmp_path / "ok.gguf")
    touch_everything(path)
    with gguf_io.open(path) as f:
        assert f.header.block_count == 1 and f.header.key_length == 4
        assert list(f.tensor_bytes("b")) == list(range(32, 64))


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(gguf_io.GGUFError, match="cannot open"):
        gguf_io.open(tmp_path / "nope.gguf")
    with pytest.raises(gguf_io.GGUFError, match="directory"):
        gguf_io.open(tmp_path)


def test_split_shard_missing_or_mislabelled(tmp_path: Path) -> None:
    def shard(no: int, count: int) -> RawGGUF:
        g = minimal_model()
        g.kv_raw("split.no", 2, struct.pack("<H", no)).kv_raw("split.count", 2, struct.pack("<H", count))
        return g

    shard(0, 2).write(tmp_path / "m-00001-of-00002.gguf")
    with pytest.raises(gguf_io.GGUFError, match="shard 2 of 2 is missing"):
        gguf_io.open(tmp_path / "m-00001-of-00002.gguf")
    shard(0, 2).write(tmp_path / "m-00002-of-00002.gguf")
    with pytest.raises(gguf_io.GGUFError, match=r"split\.no"):
        gguf_io.open(tmp_path / "m-00001-of-00002.gguf")
    shard(1, 2).write(tmp_path / "m-00002-of-00002.gguf")
    with pytest.raises(gguf_io.GGUFError, match="also in an earlier shard"):
        gguf_io.open(tmp_path / "m-00001-of-00002.gguf")
    with pytest.raises(gguf_io.GGUFError, match="open the first shard"):
        gguf_io.open(tmp_path / "m-00002-of-00002.gguf")


def test_count_of_hostile_cases() -> None:
    assert len(CASES) >= 30
