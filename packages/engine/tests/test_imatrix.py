"""llama-imatrix: collection on a tiny model, the GGUF and legacy formats read back by llama-quant, merging,
and parity with llama.cpp's own tool on SmolLM2."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_tools import portable_tool, run_ours
from tiny_models import write_tiny_model

from llama_quant.imatrix import load_imatrix
from llama_quant.imatrix_file import load_raw

TEXT = " ".join(f"word{i % 37} and more text {i}" for i in range(200))


def _imatrix(*args: str) -> subprocess.CompletedProcess[str]:
    return run_ours("imatrix", *args)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("imx")
    model = write_tiny_model(d / "m.gguf", "llama")
    (d / "cal.txt").write_text(TEXT + "\n")
    r = _imatrix("-m", str(model), "-f", str(d / "cal.txt"), "-o", str(d / "a.gguf"), "-c", "32", "-b", "64",
                 "--chunks", "4", "--process-output")  # fmt: skip
    assert r.returncode == 0, r.stderr
    r2 = _imatrix("-m", str(model), "-f", str(d / "cal.txt"), "-o", str(d / "a.dat"), "-c", "32",
                  "--chunks", "4", "--output-format", "dat")  # fmt: skip
    assert r2.returncode == 0, r2.stderr
    return d, r


def test_gguf_read_by_quant(run):
    d, r = run
    assert "Final estimate: PPL = " in r.stdout and r.stdout.startswith("[1]")
    im = load_imatrix(d / "a.gguf")
    raw = load_raw(d / "a.gguf", 32)
    assert im.chunk_count == 4 and raw.chunk_size == 32 and im.datasets == [str(d / "cal.txt")]
    assert "output.weight" in im.entries and "blk.0.attn_q.weight" in im.entries
    e = raw.entries["blk.1.ffn_down.weight"]
    assert int(e.counts[0]) == 4 * 32
    np.testing.assert_allclose(im.entries["blk.1.ffn_down.weight"], (e.sum2[0] / 128).astype(np.float32))
    # q, k and v read the same input
    np.testing.assert_array_equal(
        raw.entries["blk.0.attn_q.weight"].sum2, raw.entries["blk.0.attn_v.weight"].sum2
    )


def test_dat_matches_gguf(run):
    d, _ = run
    g, dat = load_imatrix(d / "a.gguf"), load_imatrix(d / "a.dat")
    assert dat.is_legacy and dat.chunk_count == 4 and "output.weight" not in dat.entries
    for name, v in dat.entries.items():
        np.testing.assert_allclose(v, g.entries[name], rtol=1e-5)


def test_merge_in_files(run):
    d, _ = run
    out = d / "merged.gguf"
    r = _imatrix("--in-file", str(d / "a.gguf"), "--in-file", str(d / "a.dat"), "-o", str(out), "-c", "32")
    assert r.returncode == 0, r.stderr
    m, a = load_raw(out, 32), load_raw(d / "a.gguf", 32)
    e, ea = m.entries["blk.0.ffn_up.weight"], a.entries["blk.0.ffn_up.weight"]
    assert int(e.counts[0]) == 2 * int(ea.counts[0]) and m.chunk_count == 8
    np.testing.assert_allclose(e.sum2, 2 * ea.sum2, rtol=1e-5)
    assert e.sums is None  # a legacy input has no activation sums


# both sides without flash attention (the default, on, is compared in test_kld_parity.py)
NO_FLASH = ["-fa", "off"]


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cal") / "cal.txt"
    path.write_text(Path(__file__).read_text()[:5000])
    return path


@pytest.mark.parity
@pytest.mark.parametrize("fa", [NO_FLASH, []], ids=["fa-off", "default"])
def test_imatrix_parity_with_llama_cpp(tmp_path, smollm2_path, calibration, fa):
    """Entries equal llama.cpp's llama-imatrix (portable build, -fa off on both sides, then both defaults:
    flash attention on) to float-summation noise: our sums are in float64, llama.cpp's in float32
    (relative 1e-5 by norm, 1e-2 per entry at most; measured 1e-6)."""
    args = ["-m", str(smollm2_path), "-f", str(calibration), "-c", "128", "-b", "256", "--chunks", "4"]
    ref = subprocess.run(
        [str(portable_tool("llama-imatrix")), *args, *fa, "-o", str(tmp_path / "r.gguf")],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert ref.returncode == 0, ref.stderr
    ours = _imatrix(*args, *fa, "-o", str(tmp_path / "o.gguf"))
    assert ours.returncode == 0, ours.stderr
    r, o = load_raw(tmp_path / "r.gguf", 128), load_raw(tmp_path / "o.gguf", 128)
    assert set(r.entries) == set(o.entries)
    for name, e in r.entries.items():
        np.testing.assert_array_equal(e.counts, o.entries[name].counts)
        a, b = e.sum2.ravel().astype(np.float64), o.entries[name].sum2.ravel().astype(np.float64)
        assert np.linalg.norm(a - b) / np.linalg.norm(a) < 1e-5, name
        np.testing.assert_allclose(b, a, rtol=1e-2, atol=1e-6 * float(np.abs(a).max()), err_msg=name)


def _final_ppl(text: str) -> float:
    # llama.cpp's log lines carry a time and level prefix
    found = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ", text)
    assert found, text[-2000:]
    return float(found.group(1))


@pytest.mark.parity
def test_perplexity_parity_with_llama_cpp(smollm2_path, calibration):
    """The final estimate equals llama.cpp's llama-perplexity (portable build, no flash attention) to the
    printed digits: the logits are bit-equal."""
    args = ["-m", str(smollm2_path), "-f", str(calibration), "-c", "128", "-b", "256", "--chunks", "4"]
    ref = subprocess.run(
        [str(portable_tool("llama-perplexity")), *args, *NO_FLASH],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert ref.returncode == 0, ref.stderr
    ours = run_ours("perplexity", *args, *NO_FLASH, timeout=900)
    assert ours.returncode == 0, ours.stderr
    ref_ppl, our_ppl = _final_ppl(ref.stdout + ref.stderr), _final_ppl(ours.stdout)
    assert our_ppl == ref_ppl
