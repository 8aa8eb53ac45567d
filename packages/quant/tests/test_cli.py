"""The llama-quant command line on tiny synthetic models: paths, options, errors, compare, atomic output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import gguf_io
from gguf_io import GGMLQuantizationType as T
from gguf_io import GGUFValueType
from llama_quant.cli import compare_files, main


def write_model(path: Path, n_embd: int = 256, n_ff: int = 512, n_layer: int = 2, vocab: int = 64, seed=0):
    """A llama-architecture model with F32 weights (ggml shapes: row length first)."""
    rng = np.random.default_rng(seed)
    w = gguf_io.GGUFWriter(path)
    w.add_metadata("general.architecture", "llama")
    w.add_metadata("general.name", "tiny")
    w.add_metadata("llama.block_count", n_layer, GGUFValueType.UINT32)
    w.add_metadata("llama.embedding_length", n_embd, GGUFValueType.UINT32)
    w.add_metadata("llama.attention.head_count", 4, GGUFValueType.UINT32)
    w.add_metadata("llama.attention.head_count_kv", 2, GGUFValueType.UINT32)
    w.add_metadata("general.file_type", 0, GGUFValueType.UINT32)

    def add(name, *shape):
        w.add_tensor(name, shape, T.F32, rng.standard_normal(shape[::-1]).astype(np.float32))

    add("token_embd.weight", n_embd, vocab)
    add("output_norm.weight", n_embd)
    add("output.weight", n_embd, vocab)
    for i in range(n_layer):
        add(f"blk.{i}.attn_norm.weight", n_embd)
        for part in ("q", "k", "v", "output"):
            add(f"blk.{i}.attn_{part}.weight", n_embd, n_embd)
        add(f"blk.{i}.ffn_norm.weight", n_embd)
        add(f"blk.{i}.ffn_gate.weight", n_embd, n_ff)
        add(f"blk.{i}.ffn_up.weight", n_embd, n_ff)
        add(f"blk.{i}.ffn_down.weight", n_ff, n_embd)
    w.finish()
    return path


@pytest.fixture
def model(tmp_path) -> Path:
    return write_model(tmp_path / "tiny-f32.gguf")


def types_of(path: Path) -> dict[str, str]:
    with gguf_io.open(path) as f:
        return {n: t.ggml_type.name for n, t in f.tensors.items()}


def run(capsys, *args) -> tuple[int, str, str]:
    status = main([str(a) for a in args])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_default_output_path_and_metadata(model, capsys):
    status, out, _ = run(capsys, model, "q4_k_m")
    assert status == 0
    dst = model.parent / "ggml-model-Q4_K_M.gguf"
    assert dst.exists()
    types = types_of(dst)
    assert types["output_norm.weight"] == "F32" and types["blk.0.attn_norm.weight"] == "F32"
    assert types["blk.0.attn_q.weight"] == "Q4_K"
    # use_more_bits(i, 2): only the last 1/8 of the layers (i >= 7*2/8) gets Q6_K
    assert (types["blk.0.ffn_down.weight"], types["blk.1.ffn_down.weight"]) == ("Q4_K", "Q6_K")
    assert types["output.weight"] == "Q6_K"
    with gguf_io.open(dst) as f:
        keys = list(f.fields)
        assert keys[-2:] == ["general.quantization_version", "general.file_type"]
        assert f.metadata["general.file_type"] == 15
        assert f.fields["general.file_type"].value_type == GGUFValueType.UINT32
    assert "quant size" in out and "BPW" in out


@pytest.mark.parametrize("spec", ["15", "Q4_K", "q4_K_m"])
def test_type_by_name_alias_or_number(model, tmp_path, capsys, spec):
    dst = tmp_path / "out.gguf"
    assert run(capsys, model, dst, spec)[0] == 0
    with gguf_io.open(dst) as f:
        assert f.metadata["general.file_type"] == 15


def test_dry_run_writes_nothing(model, tmp_path, capsys):
    before = sorted(os.listdir(tmp_path))
    status, out, _ = run(capsys, "--dry-run", model, "Q4_0")
    assert status == 0
    assert sorted(os.listdir(tmp_path)) == before
    assert "blk.1.ffn_down.weight" in out and "converting to q4_0" in out
    assert "quant size" in out
    status, out, _ = run(capsys, "--dry-run", model, tmp_path / "x.gguf", "Q8_0")
    assert status == 0 and not (tmp_path / "x.gguf").exists()
    # like llama.cpp, a dry run only warns when the real run would need an importance matrix
    status, out, _ = run(capsys, "--dry-run", model, "Q2_K_S")
    assert status == 0 and "will require an imatrix" in out
    status, _, err = run(capsys, model, tmp_path / "x.gguf", "Q2_K_S")
    assert status == 1 and "requires an imatrix" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{m}"], "bad arguments"),
        (["{m}", "{d}/o.gguf"], "missing ftype"),
        (["{m}", "{d}/o.gguf", "Q9_9"], "invalid ftype 'Q9_9'"),
        (["{m}", "{d}/o.gguf", "Q4_0", "two"], "invalid nthread"),
        (["{m}", "{m}", "Q4_0"], "input and output files are the same"),
        (["{d}/missing.gguf", "{d}/o.gguf", "Q4_0"], "missing.gguf"),
        (["--output-tensor-type", "q9", "{m}", "Q4_0"], "invalid ggml type 'q9'"),
        (["--tensor-type", "attn_q", "{m}", "Q4_0"], "malformed tensor type"),
        (["--tensor-type", "attn_q=zz", "{m}", "Q4_0"], "invalid ggml type 'zz'"),
        (["--include-weights", "a", "--exclude-weights", "b", "{m}", "Q4_0"], "cannot be used together"),
        (["--imatrix", "{d}/none.dat", "{m}", "Q4_0"], "none.dat"),
        (["--bogus", "{m}", "Q4_0"], "No such option"),
        (["--tensor-type-file", "{d}/none.txt", "{m}", "Q4_0"], "none.txt"),
    ],
)
def test_errors_are_one_line_exit_1(model, tmp_path, capsys, args, message):
    args = [a.format(m=model, d=tmp_path) for a in args]
    status, _, err = run(capsys, *args)
    assert status == 1
    first = err.strip().splitlines()[0]
    assert first.startswith("error:") and message in first
    assert "Traceback" not in err
    assert not (tmp_path / "o.gguf").exists()


def test_malformed_input(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    status, _, err = run(capsys, bad, tmp_path / "o.gguf", "Q4_0")
    assert status == 1 and err.startswith("error:") and "Traceback" not in err
    bad.write_bytes(b"not a model at all")
    assert run(capsys, bad, tmp_path / "o.gguf", "Q4_0")[0] == 1
    assert not (tmp_path / "o.gguf").exists()


def test_unsupported_shape_is_an_error(tmp_path, capsys):
    m = write_model(tmp_path / "narrow.gguf", n_embd=48, n_ff=96)
    status, _, err = run(capsys, "--output-tensor-type", "q4_k", m, tmp_path / "o.gguf", "Q8_0")
    assert status == 1 and "output.weight" in err and "Q4_K" in err
    # without the explicit type the fallback rules pick a type that fits (F16 here: 48 is not a multiple of 32)
    assert run(capsys, m, tmp_path / "o.gguf", "Q4_K_M")[0] == 0
    assert types_of(tmp_path / "o.gguf")["blk.0.attn_q.weight"] == "F16"


def test_requantize_refused_without_flag(model, tmp_path, capsys):
    q8 = tmp_path / "q8.gguf"
    assert run(capsys, model, q8, "Q8_0")[0] == 0
    status, _, err = run(capsys, q8, tmp_path / "q4.gguf", "Q4_0")
    assert status == 1 and "requantizing from type Q8_0 is disabled" in err
    assert not (tmp_path / "q4.gguf").exists()
    assert run(capsys, "--allow-requantize", q8, tmp_path / "q4.gguf", "Q4_0")[0] == 0
    assert types_of(tmp_path / "q4.gguf")["blk.0.attn_q.weight"] == "Q4_0"


def test_options_change_types(model, tmp_path, capsys):
    dst = tmp_path / "o.gguf"
    args = ["--tensor-type", "ATTN_V=q8_0", "--output-tensor-type", "f16", "--token-embedding-type", "q5_k"]
    assert run(capsys, *args, model, dst, "Q4_K_M")[0] == 0
    types = types_of(dst)
    assert types["blk.0.attn_v.weight"] == types["blk.1.attn_v.weight"] == "Q8_0"
    assert types["output.weight"] == "F16" and types["token_embd.weight"] == "Q5_K"
    (tmp_path / "types.txt").write_text("ffn_down=q8_0\n  attn_q=Q5_K\n")
    assert run(capsys, "--tensor-type-file", tmp_path / "types.txt", model, dst, "Q4_K_M")[0] == 0
    types = types_of(dst)
    assert types["blk.0.ffn_down.weight"] == "Q8_0" and types["blk.1.attn_q.weight"] == "Q5_K"
    assert run(capsys, "--pure", "--leave-output-tensor", model, dst, "Q4_K_M")[0] == 0
    types = types_of(dst)
    assert types["output.weight"] == "F32"
    assert {types[n] for n in types if n.startswith("blk.") and "norm" not in n} == {"Q4_K"}


def test_imatrix_metadata(model, tmp_path, capsys):
    imat = tmp_path / "imatrix.gguf"
    w = gguf_io.GGUFWriter(imat)
    w.add_metadata("imatrix.datasets", ["wiki.txt"], GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_metadata("imatrix.chunk_count", 3, GGUFValueType.UINT32)
    w.add_metadata("imatrix.chunk_size", 512, GGUFValueType.UINT32)
    with gguf_io.open(model) as f:
        for n, t in f.tensors.items():
            if n.startswith("blk.") and len(t.shape) == 2:
                w.add_tensor(f"{n}.in_sum2", (t.shape[0], 1), T.F32, np.full(t.shape[0], 2.0, np.float32))
                w.add_tensor(f"{n}.counts", (1, 1), T.F32, np.array([2.0], np.float32))
    w.finish()
    dst = tmp_path / "o.gguf"
    assert run(capsys, "--imatrix", imat, "--exclude-weights", "ffn_", model, dst, "Q4_0")[0] == 0
    with gguf_io.open(dst) as f:
        md = f.metadata
        assert md["quantize.imatrix.file"] == str(imat)
        assert md["quantize.imatrix.dataset"] == "wiki.txt"
        assert md["quantize.imatrix.entries_count"] == 8  # 2 layers x 4 attention matrices
        assert md["quantize.imatrix.chunks_count"] == 3
        assert list(f.fields)[-4:] == [
            "quantize.imatrix.file",
            "quantize.imatrix.dataset",
            "quantize.imatrix.entries_count",
            "quantize.imatrix.chunks_count",
        ]


def test_compare(model, tmp_path, capsys):
    q8 = tmp_path / "q8.gguf"
    assert run(capsys, model, q8, "Q8_0")[0] == 0
    rows = {r[0]: r for r in compare_files(str(model), str(q8))}
    assert rows["blk.0.attn_norm.weight"][3] == 0.0
    _, ta, tb, rmse, mx = rows["blk.0.attn_q.weight"]
    assert (ta, tb) == ("F32", "Q8_0") and 0 < rmse < 0.02 and rmse <= mx < 0.05
    status, out, _ = run(capsys, "compare", model, q8)
    assert status == 0 and "blk.1.ffn_down.weight" in out and "largest RMSE" in out
    assert all(r[3] == 0.0 for r in compare_files(str(q8), str(q8)))
    assert run(capsys, "compare", model, tmp_path / "none.gguf")[0] == 1


def test_kill_9_mid_write_leaves_no_output(tmp_path):
    src = tmp_path / "big.gguf"
    write_model(src, n_embd=1024, n_ff=2048, n_layer=4, vocab=256)
    dst = tmp_path / "out.gguf"
    code = "import sys; from llama_quant.cli import main; main(sys.argv[1:])"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(src), str(dst), "IQ4_NL", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        line = ""
        while "[   3/" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert "[   3/" in line, "no progress before the process ended"
        assert proc.poll() is None, "finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not dst.exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("big.gguf",)]
    assert all(n.startswith(".out.gguf.") and n.endswith(".tmp") for n in leftovers)


def test_copy_keeps_every_tensor(model, tmp_path, capsys):
    q8 = tmp_path / "q8.gguf"
    assert run(capsys, model, q8, "Q8_0")[0] == 0
    dst = tmp_path / "copy.gguf"
    assert run(capsys, q8, dst, "COPY")[0] == 0
    assert types_of(dst) == types_of(q8)
    with gguf_io.open(dst) as f:
        assert f.metadata["general.file_type"] == 7
    assert compare_files(str(q8), str(dst))[0][3] == 0.0
