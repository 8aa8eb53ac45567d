"""gguf-io against gguf-py's GGUFReader on both real models, and byte-identical rewrites."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import numpy as np
import pytest

import gguf_io

MODELS = ["smollm2_path", "gemma3_path"]


@pytest.fixture(scope="module", params=MODELS)
def model(request: pytest.FixtureRequest) -> tuple[str, gguf.GGUFReader]:
    path = request.getfixturevalue(request.param)
    return path, gguf.GGUFReader(path)


def _gguf_py_value(field: gguf.ReaderField) -> object:
    """A gguf-py field as plain Python, the way gguf-io's `metadata` presents it."""
    vtype = gguf.GGUFValueType(field.types[0])
    if vtype == gguf.GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode()
    if vtype == gguf.GGUFValueType.ARRAY:
        if len(field.types) == 1:  # gguf-py records no item type for an empty array
            return []
        itype = gguf.GGUFValueType(field.types[1])
        if itype == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode() for i in field.data]
        values = [field.parts[i].tolist()[0] for i in field.data]
        return [bool(v) for v in values] if itype == gguf.GGUFValueType.BOOL else values
    value = field.parts[-1].tolist()[0]
    return bool(value) if vtype == gguf.GGUFValueType.BOOL else value


def test_metadata_equals_gguf_py(model: tuple[str, gguf.GGUFReader]) -> None:
    path, ref = model
    with gguf_io.open(path) as f:
        expected = {k: _gguf_py_value(v) for k, v in ref.fields.items() if not k.startswith("GGUF.")}
        assert list(f.metadata) == list(expected)
        for key, value in expected.items():
            assert f.metadata[key] == value, key
            assert f.fields[key].value_type == ref.fields[key].types[0], key
        assert f.version == ref.fields["GGUF.version"].parts[-1][0]
        assert f.data_offset == ref.data_offset


def test_every_tensor_equals_gguf_py(model: tuple[str, gguf.GGUFReader]) -> None:
    path, ref = model
    with gguf_io.open(path) as f:
        assert list(f.tensors) == [t.name for t in ref.tensors]
        for t in ref.tensors:
            info = f.tensors[t.name]
            assert info.ggml_type == t.tensor_type
            assert info.shape == tuple(int(d) for d in t.shape)
            assert info.offset == t.data_offset
            assert info.nbytes == t.n_bytes
            raw = f.tensor_bytes(t.name)
            assert raw.dtype == np.uint8 and not raw.flags.writeable
            assert np.array_equal(raw, np.asarray(t.data).view(np.uint8).reshape(-1)), t.name


def test_tensor_views_are_zero_copy(smollm2_path: str) -> None:
    with gguf_io.open(smollm2_path) as f:
        a = f.tensor_bytes("token_embd.weight")
        b = f.tensor_bytes("token_embd.weight")
        assert np.shares_memory(a, b)
        assert a.base is not None


def _sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@pytest.mark.parametrize("which", MODELS)
def test_rewrite_is_byte_identical(which: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    src = request.getfixturevalue(which)
    dst = tmp_path / "copy.gguf"
    with gguf_io.open(src) as f, gguf_io.GGUFWriter(dst, alignment=f.alignment, version=f.version) as w:
        for field in f.fields.values():
            w.add_field(field)
        for t in f.tensors.values():
            w.add_tensor(t.name, t.shape, t.ggml_type, lambda name=t.name: f.tensor_bytes(name))
    assert _sha256(dst) == _sha256(src)


def test_written_file_reads_back_in_gguf_py(smollm2_path: str, tmp_path: Path) -> None:
    """Every value type, arrays of each, and tensors of several types, read back by gguf-py."""
    dst = tmp_path / "types.gguf"
    V = gguf.GGUFValueType
    scalars = {
        "t.u8": (7, V.UINT8),
        "t.i8": (-7, V.INT8),
        "t.u16": (65535, V.UINT16),
        "t.i16": (-300, V.INT16),
        "t.u32": (4_000_000_000, V.UINT32),
        "t.i32": (-5, V.INT32),
        "t.f32": (1.5, V.FLOAT32),
        "t.bool": (True, V.BOOL),
        "t.str": ("héllo ✓", V.STRING),
        "t.u64": (1 << 63, V.UINT64),
        "t.i64": (-(1 << 40), V.INT64),
        "t.f64": (0.1, V.FLOAT64),
    }
    with gguf_io.open(smollm2_path) as src, gguf_io.GGUFWriter(dst) as w:
        for key, (value, vtype) in scalars.items():
            w.add_metadata(key, value, vtype)
        w.add_metadata("a.str", ["x", "", "日本"], V.ARRAY, V.STRING)
        w.add_metadata("a.f32", [0.5, -2.0], V.ARRAY, V.FLOAT32)
        w.add_metadata("a.bool", [True, False], V.ARRAY, V.BOOL)
        w.add_metadata("a.i64", np.array([1, -2], dtype=np.int64))
        w.add_metadata("a.empty", [], V.ARRAY, V.UINT8)
        for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight"):
            t = src.tensors[name]
            w.add_tensor(name, t.shape, t.ggml_type, src.tensor_bytes(name))
        w.add_tensor("f16", [4, 2], gguf.GGMLQuantizationType.F16, np.arange(8, dtype=np.float16))
    ref = gguf.GGUFReader(dst)
    for key, (value, vtype) in scalars.items():
        assert ref.fields[key].types == [vtype]
        got = _gguf_py_value(ref.fields[key])
        assert got == (pytest.approx(value) if vtype == V.FLOAT32 else value), key
    assert _gguf_py_value(ref.fields["a.str"]) == ["x", "", "日本"]
    assert _gguf_py_value(ref.fields["a.f32"]) == [0.5, -2.0]
    assert _gguf_py_value(ref.fields["a.bool"]) == [True, False]
    assert _gguf_py_value(ref.fields["a.i64"]) == [1, -2]
    assert _gguf_py_value(ref.fields["a.empty"]) == []
    with gguf_io.open(smollm2_path) as src:
        for t in ref.tensors[:3]:
            assert np.array_equal(np.asarray(t.data).view(np.uint8).reshape(-1), src.tensor_bytes(t.name))
    f16 = ref.tensors[3]
    assert list(f16.shape) == [4, 2] and np.array_equal(f16.data.reshape(-1), np.arange(8, dtype=np.float16))


def _mapped_rss_kib(path: str) -> int:
    """Resident KiB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, ours = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                ours = len(head) > 5 and head[5] == path
            elif ours and head[0] == "Rss:":
                total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs /proc")
def test_release_drops_resident_pages_and_keeps_views_valid(smollm2_path: str) -> None:
    path = str(Path(smollm2_path).resolve())
    with gguf_io.open(path) as f:
        name = max(f.tensors, key=lambda n: f.tensors[n].nbytes)
        view = f.tensor_bytes(name)
        digest = hashlib.sha256(view).hexdigest()  # touches every page of the tensor
        before = _mapped_rss_kib(path)
        f.release(name)
        after = _mapped_rss_kib(path)
        assert before - after >= view.nbytes // 1024 - 8  # all its pages, bar the two shared at its ends
        assert hashlib.sha256(view).hexdigest() == digest  # read back from the file
        f.release()
        assert _mapped_rss_kib(path) < 64
        with pytest.raises(KeyError):
            f.release("no such tensor")
    f.release(name)  # a closed file: nothing to drop
