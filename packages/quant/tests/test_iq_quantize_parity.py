"""Grid i-quant quantization against llama.cpp itself (run by `nox -s parity`): the bytes of every grid type,
of whole files in the file types that mix them, and llama-quantize's refusal without an importance matrix.

llama.cpp's side is its ``llama-quantize`` (the release the project follows: $LLAMA_CPP_PORTABLE_BIN,
$LLAMA_CPP_BIN or the nox sessions' cache) on a tiny F32 llama whose rows are whole 256-value super-blocks,
and libggml's ``ggml_quantize_chunk`` (through llama-cpp-python) on a slice of a real SmolLM2 tensor.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import make_imatrix, smollm2_file

import gguf_io
import llama_quant as lq
from gguf_io import GGMLQuantizationType as T
from gguf_io import GGUFValueType, GGUFWriter
from llama_quant.cli import main
from llama_quant.imatrix import load_imatrix
from llama_quant.imatrix_file import ImatrixData, ImatrixEntry, save_gguf

pytestmark = pytest.mark.parity

# type -> the file type whose --pure output is all that type (IQ2_S is IQ2_M's default type)
PURE = {
    T.IQ2_XXS: "IQ2_XXS",
    T.IQ2_XS: "IQ2_XS",
    T.IQ2_S: "IQ2_M",
    T.IQ3_XXS: "IQ3_XXS",
    T.IQ3_S: "IQ3_S",
    T.IQ1_S: "IQ1_S",
    T.IQ1_M: "IQ1_M",
}
N_EMBD, N_FF, N_VOCAB = 256, 512, 259


def _llama_quantize() -> Path:
    folders = [Path(os.environ[k]) for k in ("LLAMA_CPP_PORTABLE_BIN", "LLAMA_CPP_BIN") if os.environ.get(k)]
    folders += sorted((Path.home() / ".cache" / "llama-py").glob("llama-cpp-bin-*/bin"), reverse=True)
    for folder in folders:
        if (folder / "llama-quantize").is_file():
            return folder / "llama-quantize"
    raise RuntimeError("llama.cpp's llama-quantize was not found (build it with `nox -s llama-cpp`)")


def _write_model(path: Path) -> None:
    """A one-layer F32 llama, 256 wide (only the metadata llama-quantize reads, and a byte vocabulary)."""
    rng = np.random.default_rng(7)
    w = GGUFWriter(path)
    w.add_metadata("general.architecture", "llama")
    w.add_metadata("general.name", "tiny-iq")
    for key, value in {
        "block_count": 1,
        "context_length": 256,
        "embedding_length": N_EMBD,
        "feed_forward_length": N_FF,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "vocab_size": N_VOCAB,
    }.items():
        w.add_metadata(f"llama.{key}", value, GGUFValueType.UINT32)
    w.add_metadata("llama.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_metadata("tokenizer.ggml.model", "gpt2")
    w.add_metadata("tokenizer.ggml.tokens", [f"<{i}>" for i in range(N_VOCAB)])
    w.add_metadata("tokenizer.ggml.token_type", np.ones(N_VOCAB, np.int32))
    w.add_metadata("tokenizer.ggml.merges", [], GGUFValueType.ARRAY, GGUFValueType.STRING)

    def mat(name: str, rows: int, cols: int) -> None:
        x = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(0.3)
        x[rows // 3, : cols // 2] = 0.0  # all-zero blocks and ties in the sorts
        w.add_tensor(name, [cols, rows], T.F32, x)

    def vec(name: str, n: int) -> None:
        w.add_tensor(name, [n], T.F32, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    mat("token_embd.weight", N_VOCAB, N_EMBD)
    vec("output_norm.weight", N_EMBD)
    mat("output.weight", N_VOCAB, N_EMBD)
    vec("blk.0.attn_norm.weight", N_EMBD)
    mat("blk.0.attn_q.weight", N_EMBD, N_EMBD)
    mat("blk.0.attn_k.weight", N_EMBD // 2, N_EMBD)
    mat("blk.0.attn_v.weight", N_EMBD // 2, N_EMBD)
    mat("blk.0.attn_output.weight", N_EMBD, N_EMBD)
    vec("blk.0.ffn_norm.weight", N_EMBD)
    mat("blk.0.ffn_gate.weight", N_FF, N_EMBD)
    mat("blk.0.ffn_up.weight", N_FF, N_EMBD)
    mat("blk.0.ffn_down.weight", N_EMBD, N_FF)
    w.finish()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The F32 model and an importance matrix for every matrix of it (token embeddings included)."""
    folder = tmp_path_factory.mktemp("iqq")
    model = folder / "tiny-f32.gguf"
    _write_model(model)
    rng = np.random.default_rng(1)
    data = ImatrixData(datasets=["random"], chunk_count=1, chunk_size=512)
    with gguf_io.open(model) as f:
        for name, t in f.tensors.items():
            if len(t.shape) == 2:
                e = ImatrixEntry.empty(t.shape[0])
                e.sum2[:] = np.exp(rng.normal(0.0, 1.5, (1, t.shape[0])))
                e.counts[:] = 1
                data.entries[name] = e
    save_gguf(str(folder / "imatrix.gguf"), data)
    return model, folder / "imatrix.gguf"


def _run_llama_quantize(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(_llama_quantize()), *map(str, args)], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("imatrix", [True, False], ids=["imatrix", "plain"])
@pytest.mark.parametrize("qtype", list(PURE), ids=lambda t: t.name)
def test_every_tensor_matches_llama_quantize(tiny, tmp_path, qtype, imatrix):
    model, imatrix_file = tiny
    out = tmp_path / "theirs.gguf"
    args = ["--imatrix", imatrix_file] if imatrix else []
    r = _run_llama_quantize(*args, "--pure", model, out, PURE[qtype], "2")
    if not imatrix and qtype not in (T.IQ3_S,):  # llama.cpp refuses the others without one
        assert r.returncode != 0 and "requires an importance matrix" in r.stderr
        return
    assert r.returncode == 0, r.stderr[-2000:]
    entries = load_imatrix(imatrix_file).entries if imatrix else {}
    seen = 0
    with gguf_io.open(model) as src, gguf_io.open(out) as theirs:
        for name, info in theirs.tensors.items():
            if info.ggml_type != qtype:
                continue
            x = np.asarray(src.tensor_bytes(name)).view(np.float32).reshape(-1, info.shape[0])
            ours = lq.quantize(x, qtype, imatrix=entries.get(name))
            want = np.asarray(theirs.tensor_bytes(name)).view(np.uint8).reshape(-1)
            assert np.array_equal(ours, want), (
                f"{name}: first difference at {np.flatnonzero(ours != want)[:8]}"
            )
            seen += 1
    assert seen == 9


@pytest.mark.parametrize("ftype", ["IQ2_M", "IQ3_M", "IQ3_XS", "IQ1_S"])
def test_whole_file_matches_llama_quantize(tiny, tmp_path, ftype):
    model, imatrix_file = tiny
    theirs, ours = tmp_path / "theirs.gguf", tmp_path / "ours.gguf"
    r = _run_llama_quantize("--imatrix", imatrix_file, model, theirs, ftype, "2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert main(["--imatrix", str(imatrix_file), str(model), str(ours), ftype, "2"]) == 0
    assert ours.read_bytes() == theirs.read_bytes()


@pytest.mark.parametrize("ftype", ["IQ2_XXS", "IQ3_XXS", "IQ1_M"])
def test_refusal_without_imatrix_matches(tiny, tmp_path, capsys, ftype):
    model, _ = tiny
    r = _run_llama_quantize(model, tmp_path / "theirs.gguf", ftype, "2")
    assert r.returncode != 0
    start = r.stderr.index("=" * 76)
    banner = r.stderr[start : r.stderr.index("=" * 76, start + 76) + 76]
    assert main([str(model), str(tmp_path / "ours.gguf"), ftype, "2"]) == 1
    err = capsys.readouterr().err
    assert banner in err
    assert "error: this quantization requires an imatrix!" in err
    assert not (tmp_path / "ours.gguf").exists()


@pytest.mark.parametrize("qtype", list(PURE), ids=lambda t: t.name)
def test_smollm2_slice_matches_ggml(ggml, qtype):
    # 24 rows of a real ffn_down (1536 columns: six super-blocks a row), its own weights
    with gguf_io.open(smollm2_file()) as f:
        info = f.tensors["blk.3.ffn_down.weight"]
        rows = np.asarray(f.tensor_bytes(info.name)).view(np.uint8).reshape(info.shape[1], -1)[:24]
        x = lq.dequantize(rows, info.ggml_type, (24, info.shape[0]))
    qw = make_imatrix(x.shape[1], seed=5)
    ours = lq.quantize(x, qtype, imatrix=qw)
    assert np.array_equal(ours, ggml.quantize(x, qtype, qw))
