"""Reading importance matrices: llama-imatrix's GGUF format and the legacy .dat format, and bad files."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import gguf_io
from gguf_io import GGMLQuantizationType as T
from gguf_io import GGUFError, GGUFValueType
from llama_quant.imatrix import load_imatrix


def write_gguf(path, entries, meta=True, skip_counts=(), counts_type=T.F32):
    w = gguf_io.GGUFWriter(path)
    if meta:
        w.add_metadata("imatrix.datasets", ["a.txt", "b.txt"], GGUFValueType.ARRAY, GGUFValueType.STRING)
        w.add_metadata("imatrix.chunk_count", 5, GGUFValueType.UINT32)
        w.add_metadata("imatrix.chunk_size", 512, GGUFValueType.UINT32)
    for name, (sums, counts) in entries.items():
        n_mat = len(counts)
        w.add_tensor(f"{name}.in_sum2", (sums.size // n_mat, n_mat), T.F32, sums.astype(np.float32))
        if name not in skip_counts:
            c = np.asarray(counts, dtype=np.float32)
            if counts_type == T.F16:
                c = c.astype(np.float16)
            w.add_tensor(f"{name}.counts", (1, n_mat), counts_type, c)
    w.finish()
    return path


def test_gguf_values_are_sums_over_counts(tmp_path):
    sums = np.arange(1, 9, dtype=np.float32)
    path = write_gguf(
        tmp_path / "i.gguf", {"blk.0.ffn_down.weight": (sums, [2.0, 0.0]), "w": (sums[:4], [3.0])}
    )
    im = load_imatrix(path)
    assert not im.is_legacy and im.datasets == ["a.txt", "b.txt"] and im.chunk_count == 5
    np.testing.assert_array_equal(im.entries["blk.0.ffn_down.weight"], [0.5, 1.0, 1.5, 2.0, 1, 1, 1, 1])
    np.testing.assert_array_equal(im.entries["w"], sums[:4] / np.float32(3.0))
    assert im.entries["w"].dtype == np.float32


def test_select_include_exclude(tmp_path):
    one = (np.ones(4, np.float32), [1.0])
    path = write_gguf(tmp_path / "i.gguf", {"blk.0.attn_q.weight": one, "blk.0.ffn_up.weight": one, "x": one})
    im = load_imatrix(path)
    assert sorted(im.select(exclude=["ffn_"]).entries) == ["blk.0.attn_q.weight", "x"]
    assert sorted(im.select(include=["blk.0"]).entries) == ["blk.0.attn_q.weight", "blk.0.ffn_up.weight"]


def write_legacy(path, entries, last_chunk=None, dataset=None):
    out = struct.pack("<i", len(entries))
    for name, (ncall, values) in entries.items():
        raw = name.encode()
        out += struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, len(values))
        out += np.asarray(values, dtype="<f4").tobytes()
    if last_chunk is not None:
        out += struct.pack("<i", last_chunk)
        if dataset is not None:
            out += struct.pack("<i", len(dataset)) + dataset.encode()
    path.write_bytes(out)
    return path


def test_legacy_values_are_divided_by_ncall(tmp_path):
    path = write_legacy(tmp_path / "i.dat", {"a": (4, [4.0, 8.0]), "b": (0, [3.0])}, 12, "wiki.txt")
    im = load_imatrix(path)
    assert im.is_legacy and im.chunk_count == 12 and im.datasets == ["wiki.txt"]
    np.testing.assert_array_equal(im.entries["a"], [1.0, 2.0])
    np.testing.assert_array_equal(im.entries["b"], [3.0])
    im = load_imatrix(write_legacy(tmp_path / "j.dat", {"a": (1, [1.0])}))
    assert im.chunk_count == 0 and im.datasets == []


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\x00\x00\x00\x00",  # no entries
        struct.pack("<i", 1) + struct.pack("<i", 1 << 30),  # name longer than the file
        struct.pack("<i", 1) + struct.pack("<i", 1) + b"a" + struct.pack("<ii", 1, 0),  # no values
        struct.pack("<i", 1) + struct.pack("<i", 1) + b"a" + struct.pack("<ii", 1, 1 << 28),  # truncated
        struct.pack("<i", 1) + struct.pack("<i", -5),
    ],
)
def test_bad_legacy_files(tmp_path, blob):
    path = tmp_path / "bad.dat"
    path.write_bytes(blob)
    with pytest.raises(GGUFError):
        load_imatrix(path)


def test_bad_gguf_files(tmp_path):
    one = {"w": (np.ones(4, np.float32), [1.0])}
    with pytest.raises(GGUFError, match="missing imatrix metadata"):
        load_imatrix(write_gguf(tmp_path / "a.gguf", one, meta=False))
    with pytest.raises(GGUFError, match="mismatched"):
        load_imatrix(write_gguf(tmp_path / "b.gguf", one, skip_counts=("w",)))
    with pytest.raises(GGUFError, match="F32"):
        load_imatrix(write_gguf(tmp_path / "c.gguf", one, counts_type=T.F16))
    (tmp_path / "d.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(GGUFError):
        load_imatrix(tmp_path / "d.gguf")
    with pytest.raises(GGUFError):
        load_imatrix(tmp_path / "missing.gguf")
