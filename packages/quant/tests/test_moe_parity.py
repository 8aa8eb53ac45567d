"""llama-quant against llama.cpp's ``llama-quantize`` on tiny MoE, hybrid and recurrent models.

The layouts of moe_models (qwen3moe, gpt-oss, qwen35moe, granitehybrid, lfm2) are written with random
weights; then every file type's per-tensor type table (dry runs on both sides) must be equal, and for the
mixes actually run the output files must be byte-identical, with and without a per-expert importance matrix.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import moe_models
import numpy as np
import pytest
from plans import digest, our_types

import gguf_io
from gguf_io import GGMLQuantizationType as T
from gguf_io import GGUFValueType
from llama_quant.cli import main
from llama_quant.mixture import (
    FILE_TYPES,
    default_type,
    parse_file_type,
)

pytestmark = pytest.mark.parity

NTHREAD = 2
# a tensor's line of llama-quantize's dry run: "... type =    f16, size =     0.12 MiB ->     0.04 MiB (q4_K)"
_LINE = re.compile(
    r"\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s+(\S+), size =\s+[\d.]+ MiB(?: ->\s+[\d.]+ MiB \((\S+)\))?"
)


def llama_quantize() -> Path:
    """llama.cpp's llama-quantize: $LLAMA_CPP_PORTABLE_BIN or $LLAMA_CPP_BIN, else the nox sessions' cache."""
    folders = [Path(os.environ[k]) for k in ("LLAMA_CPP_PORTABLE_BIN", "LLAMA_CPP_BIN") if os.environ.get(k)]
    folders += sorted((Path.home() / ".cache" / "llama-py").glob("llama-cpp-bin-*/bin"), reverse=True)
    for folder in folders:
        if (folder / "llama-quantize").is_file():
            return folder / "llama-quantize"
    pytest.fail("llama.cpp's llama-quantize was not found (set LLAMA_CPP_PORTABLE_BIN)")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("moe")
    return {
        arch: moe_models.write(folder / f"{arch}.gguf", layout(), seed=i)
        for i, (arch, layout) in enumerate(moe_models.LAYOUTS.items())
    }


def write_imatrix(model: Path, dst: Path, seed: int = 0) -> Path:
    """A GGUF imatrix for every matrix: expert tensors get one row of sums and one count per expert,
    some counts 0 (an expert no token reached: llama-quantize then uses 1.0 for its weights)."""
    rng = np.random.default_rng(seed)
    w = gguf_io.GGUFWriter(dst)
    w.add_metadata("general.type", "imatrix")
    w.add_metadata("imatrix.datasets", ["calibration.txt"], GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_metadata("imatrix.chunk_count", 7, GGUFValueType.UINT32)
    w.add_metadata("imatrix.chunk_size", 512, GGUFValueType.UINT32)
    with gguf_io.open(model) as f:
        for name in sorted(n for n, t in f.tensors.items() if n.startswith("blk.") and len(t.shape) >= 2):
            shape = f.tensors[name].shape
            ne0, n_mat = shape[0], shape[2] if len(shape) > 2 else 1
            counts = (rng.integers(0 if n_mat > 1 else 1, 4, n_mat) * 512).astype(np.float32)
            sums = np.exp(rng.normal(0, 1.5, (n_mat, ne0))) * np.maximum(counts, 1)[:, None]
            w.add_tensor(f"{name}.in_sum2", (ne0, n_mat), T.F32, sums.astype(np.float32))
            w.add_tensor(f"{name}.counts", (1, n_mat), T.F32, counts)
    w.finish()
    return dst


def theirs(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(llama_quantize()), *args], capture_output=True, text=True, timeout=600)


def _types(log: str) -> dict[str, str]:
    return {m.group(1): (m.group(3) or m.group(2)).upper() for m in _LINE.finditer(log)}


def their_table(args: list[str]) -> dict[str, str] | None:
    """llama-quantize --dry-run's per-tensor types (None when it refuses)."""
    p = theirs(["--dry-run", *args])
    if p.returncode != 0:
        return None
    return _types(p.stdout + p.stderr)


def our_table(model: Path, name: str, has_imatrix: bool = False) -> dict[str, str] | None:
    """The plan's per-tensor types (None when it refuses: no fallback type for the row length)."""
    try:
        return our_types(model, parse_file_type(name).ftype, has_imatrix=has_imatrix)
    except ValueError:
        return None


TABLE_TYPES = [ft.name for ft in FILE_TYPES if ft.name != "COPY" and default_type(ft.ftype) is not None]


@pytest.mark.parametrize("arch", sorted(moe_models.LAYOUTS))
def test_type_tables_match_llama_quantize(models, arch):
    """Every file type: the same type for every tensor, or a refusal on both sides (Q1_0 on 320-long rows)."""
    differ = []
    for name in TABLE_TYPES:
        want = their_table([str(models[arch]), name, str(NTHREAD)])
        got = our_table(models[arch], name)
        if got != want:
            diff = sorted(
                k for k in {**(want or {}), **(got or {})} if (want or {}).get(k) != (got or {}).get(k)
            )
            differ.append(f"{name}: {diff[:4]}")
    assert not differ, differ


BYTE_CASES = [
    *[("qwen3moe", n) for n in ("Q4_K_M", "Q5_K_S", "Q6_K", "Q8_0", "Q2_K", "Q3_K_M", "IQ4_XS", "MXFP4_MOE")],
    *[("gpt-oss", n) for n in ("MXFP4_MOE", "Q8_0", "Q4_K_M")],  # MXFP4 experts: requantized
    *[("gpt-oss-f16-experts", n) for n in ("MXFP4_MOE", "Q5_K_S")],
    *[("qwen35moe", n) for n in ("Q4_K_M", "Q5_K_S", "Q6_K", "Q8_0", "Q2_K", "IQ4_XS", "MXFP4_MOE")],
    *[("granitehybrid", n) for n in ("Q4_K_M", "Q5_K_S", "Q6_K", "Q8_0", "Q2_K", "MXFP4_MOE")],
    *[("lfm2", n) for n in ("Q4_K_M", "Q3_K_M")],
]


def run_both(models, tmp_path: Path, arch: str, name: str, options: list[str]) -> None:
    if arch == "gpt-oss":
        options = ["--allow-requantize", *options]
    src, want, got = models[arch], tmp_path / "llama_cpp.gguf", tmp_path / "ours.gguf"
    p = theirs([*options, str(src), str(want), name, str(NTHREAD)])
    assert p.returncode == 0, p.stderr[-2000:]
    assert main([*options, str(src), str(got), name, str(NTHREAD)]) == 0
    with gguf_io.open(want) as a, gguf_io.open(got) as b:
        assert {n: t.ggml_type for n, t in b.tensors.items()} == {
            n: t.ggml_type for n, t in a.tensors.items()
        }
        differ = [n for n in a.tensors if not np.array_equal(a.tensor_bytes(n), b.tensor_bytes(n))]
    assert not differ, f"tensor bytes differ: {differ[:4]}"
    assert digest(got) == digest(want)


@pytest.mark.parametrize(("arch", "name"), BYTE_CASES, ids=[f"{a}-{n}" for a, n in BYTE_CASES])
def test_output_bytes_match_llama_quantize(models, tmp_path, arch, name):
    run_both(models, tmp_path, arch, name, [])


IMATRIX_CASES = [("qwen3moe", "Q4_K_M"), ("qwen35moe", "Q4_K_M"), ("granitehybrid", "IQ4_XS")]


@pytest.mark.parametrize(("arch", "name"), IMATRIX_CASES, ids=[f"{a}-{n}" for a, n in IMATRIX_CASES])
def test_imatrix_output_bytes_match_llama_quantize(models, tmp_path, arch, name):
    imat = write_imatrix(models[arch], tmp_path / "imatrix.gguf")
    run_both(models, tmp_path, arch, name, ["--imatrix", str(imat)])


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_imatrix_type_tables_match_llama_quantize(models, tmp_path, arch):
    """An imatrix changes some rules (IQ3_XXS attn_v, IQ4_XS and Q4_0 ffn_down) and allows the 2-bit mixes."""
    imat = write_imatrix(models[arch], tmp_path / "imatrix.gguf")
    for name in ("IQ2_XXS", "IQ3_XXS", "IQ4_XS", "Q4_0", "IQ1_M", "Q2_K_S"):
        args = ["--imatrix", str(imat), str(models[arch]), name, str(NTHREAD)]
        assert our_table(models[arch], name, has_imatrix=True) == their_table(args), name


def test_options_on_a_hybrid_model(models, tmp_path):
    """Pruned layers (counters and imatrix names renumbered) and --tensor-type on expert tensors."""
    imat = write_imatrix(models["qwen35moe"], tmp_path / "imatrix.gguf")
    opts = ["--prune-layers", "1,3", "--imatrix", str(imat), "--tensor-type", "ffn_down_exps=q8_0"]
    run_both(models, tmp_path, "qwen35moe", "Q4_K_M", opts)
