"""GGUFWriter: atomic finish, streaming, splits, alignment, and clear errors for bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import gguf
import numpy as np
import pytest

import gguf_io
from gguf_io import GGMLQuantizationType as T
from gguf_io import GGUFValueType as V


def _tiny_writer(path: Path, **kw: object) -> gguf_io.GGUFWriter:
    w = gguf_io.GGUFWriter(path, **kw)  # type: ignore[arg-type]
    w.add_metadata("general.architecture", "llama")
    return w


def _no_leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_exception_while_streaming_leaves_no_file(tmp_path: Path) -> None:
    dst = tmp_path / "out.gguf"

    def explode() -> bytes:
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"), _tiny_writer(dst) as w:
        w.add_tensor("a", [8], T.F32, np.zeros(8, np.float32))
        w.add_tensor("b", [8], T.F32, explode)
    assert _no_leftovers(tmp_path) == []


def test_wrong_data_size_is_an_error_and_leaves_no_file(tmp_path: Path) -> None:
    dst = tmp_path / "out.gguf"
    with pytest.raises(gguf_io.GGUFError, match="need 32"), _tiny_writer(dst) as w:
        w.add_tensor("a", [8], T.F32, np.zeros(7, np.float32))
    assert _no_leftovers(tmp_path) == []


def test_existing_destination_survives_a_failed_write(tmp_path: Path) -> None:
    dst = tmp_path / "out.gguf"
    dst.write_bytes(b"precious")
    with pytest.raises(gguf_io.GGUFError), _tiny_writer(dst) as w:
        w.add_tensor("a", [8], T.F32, b"short")
    assert dst.read_bytes() == b"precious"


def test_kill_9_mid_write_leaves_no_destination(tmp_path: Path) -> None:
    dst = tmp_path / "out.gguf"
    script = textwrap.dedent(
        f"""
        import sys, time, numpy as np, gguf_io
        w = gguf_io.GGUFWriter({str(dst)!r})
        w.add_metadata("general.architecture", "llama")
        def slow(i=0):
            print("writing", flush=True)
            time.sleep(60)
            return np.zeros(1 << 20, np.float32)
        w.add_tensor("a", [1 << 20], 0, np.ones(1 << 20, np.float32))
        w.add_tensor("b", [1 << 20], 0, slow)
        w.finish()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert not dst.exists()
    leftovers = _no_leftovers(tmp_path)
    assert all(name.startswith(".out.gguf.") and name.endswith(".tmp") for name in leftovers)


def test_tensors_are_streamed_one_at_a_time(tmp_path: Path) -> None:
    live: list[int] = []
    calls: list[str] = []

    def make(name: str) -> object:
        def produce() -> np.ndarray:
            calls.append(name)
            live.append(len(calls))
            return np.full(1024, len(calls), np.float32)

        return produce

    with _tiny_writer(tmp_path / "s.gguf") as w:
        for i in range(5):
            w.add_tensor(f"t{i}", [1024], T.F32, make(f"t{i}"))  # type: ignore[arg-type]
        assert calls == []  # nothing produced before finish
    assert calls == [f"t{i}" for i in range(5)]
    with gguf_io.open(tmp_path / "s.gguf") as f:
        assert [int(f.tensor_bytes(f"t{i}").view(np.float32)[0]) for i in range(5)] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_custom_alignment(tmp_path: Path, alignment: int) -> None:
    dst = tmp_path / "a.gguf"
    with _tiny_writer(dst, alignment=alignment) as w:
        w.add_tensor("a", [3], T.F32, np.arange(3, dtype=np.float32))
        w.add_tensor("b", [5], T.F32, np.arange(5, dtype=np.float32))
    with gguf_io.open(dst) as f:
        assert f.alignment == alignment
        assert f.metadata.get("general.alignment", 32) == alignment
        assert all(t.offset % alignment == 0 for t in f.tensors.values())
        assert list(f.tensor_bytes("b").view(np.float32)) == [0, 1, 2, 3, 4]
    ref = gguf.GGUFReader(dst)
    assert list(ref.tensors[1].data) == [0, 1, 2, 3, 4]


def test_type_inference_matches_gguf_py(tmp_path: Path) -> None:
    dst = tmp_path / "t.gguf"
    with gguf_io.GGUFWriter(dst) as w:
        w.add_metadata("i", 5)
        w.add_metadata("big", 1 << 40)
        w.add_metadata("f", 0.25)
        w.add_metadata("b", False)
        w.add_metadata("s", "x")
        w.add_metadata("ls", ["a", "b"])
        w.add_metadata("lf", np.array([1.0, 2.0], dtype=np.float32))
    with gguf_io.open(dst) as f:
        types = {k: (fl.value_type, fl.array_type) for k, fl in f.fields.items()}
        assert types == {
            "i": (V.INT32, None),
            "big": (V.INT64, None),
            "f": (V.FLOAT32, None),
            "b": (V.BOOL, None),
            "s": (V.STRING, None),
            "ls": (V.ARRAY, V.STRING),
            "lf": (V.ARRAY, V.FLOAT32),
        }
        assert f.metadata["lf"] == [1.0, 2.0]


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda w: w.add_metadata("general.architecture", "x"), "already added"),
        (lambda w: w.add_metadata("", 1), "non-empty"),
        (lambda w: w.add_metadata("n", [[1]], V.ARRAY, V.ARRAY), "nested"),
        (lambda w: w.add_metadata("general.alignment", 3, V.UINT32), "power of two"),
        (lambda w: w.add_metadata("o", object()), "cannot infer"),
        (lambda w: w.add_tensor("x" * 64, [32], T.F32, b""), "bytes long"),
        (lambda w: w.add_tensor("q", [33], T.Q4_0, b""), "block size"),
        (lambda w: w.add_tensor("q", [1, 1, 1, 1, 1], T.F32, b""), "dimensions"),
        (lambda w: w.add_tensor("q", [32], 99, b""), "unknown ggml type"),
    ],
)
def test_bad_writer_input_is_a_clear_error(tmp_path: Path, call: object, fragment: str) -> None:
    w = _tiny_writer(tmp_path / "x.gguf")
    with pytest.raises(gguf_io.GGUFError, match=fragment):
        call(w)  # type: ignore[operator]


def test_out_of_range_integer_value_is_an_error(tmp_path: Path) -> None:
    w = _tiny_writer(tmp_path / "x.gguf")
    w.add_metadata("u8", 300, V.UINT8)
    with pytest.raises(gguf_io.GGUFError, match="not a valid UINT8"):
        w.finish()
    assert _no_leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("kw", "expected_shards"), [({"split_max_tensors": 100}, 3), ({"split_max_size": 40_000_000}, 3)]
)
def test_split_write_and_read_back_as_one_model(
    smollm2_path: str, tmp_path: Path, kw: dict, expected_shards: int
) -> None:
    out = tmp_path / "smol.gguf"
    with gguf_io.open(smollm2_path) as src:
        with gguf_io.GGUFWriter(out, **kw) as w:
            for field in src.fields.values():
                w.add_field(field)
            for t in src.tensors.values():
                w.add_tensor(t.name, t.shape, t.ggml_type, lambda n=t.name: src.tensor_bytes(n))
        paths = sorted(tmp_path.glob("smol-*-of-*.gguf"))
        assert len(paths) == expected_shards
        assert not out.exists()
        with gguf_io.open(paths[0]) as split:
            assert split.paths == [str(p) for p in paths]
            assert list(split.tensors) == list(src.tensors)
            assert {k: v for k, v in split.metadata.items() if not k.startswith("split.")} == src.metadata
            assert split.metadata["split.count"] == expected_shards
            for name in src.tensors:
                assert np.array_equal(split.tensor_bytes(name), src.tensor_bytes(name)), name
            assert split.header == src.header
        if "split_max_size" in kw:
            for p in paths:
                assert sum(int(t.n_bytes) for t in gguf.GGUFReader(p).tensors) <= kw["split_max_size"]


def test_close_is_safe_with_live_views(smollm2_path: str) -> None:
    f = gguf_io.open(smollm2_path)
    view = f.tensor_bytes("blk.0.attn_norm.weight")
    f.close()
    assert view.view(np.float32).shape == (576,)  # the mapping outlives close while a view exists
    with pytest.raises(gguf_io.GGUFError, match="closed"):
        f.tensor_bytes("blk.0.attn_norm.weight")
