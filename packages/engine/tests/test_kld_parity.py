"""llama-perplexity against llama.cpp's own (portable build) on SmolLM2: the default output (flash attention
auto = on in both), the base log-probability file byte for byte, and the KL-divergence figures each tool
computes from the other's file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from cli_tools import portable_tool, run_ours

ARGS = ["-c", "128", "-b", "256"]  # two chunks per batch: two sequences, as llama.cpp's default layout does


def _reference(*args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [str(portable_tool("llama-perplexity")), *args], capture_output=True, text=True, timeout=1800
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def _ours(*args: str) -> subprocess.CompletedProcess[str]:
    r = run_ours("perplexity", *args, timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


@pytest.fixture(scope="module")
def bases(tmp_path_factory, smollm2_path):
    d = tmp_path_factory.mktemp("kldp")
    text = d / "t.txt"
    text.write_text(Path(__file__).with_name("test_imatrix.py").read_text()[:5000])
    common = ["-m", str(smollm2_path), "-f", str(text), *ARGS, "--chunks", "4"]
    ref = _reference(*common, "--kl-divergence-base", str(d / "ref.bin"))
    ours = _ours(*common, "--kl-divergence-base", str(d / "ours.bin"))
    return d, ref, ours


def _final(text: str) -> str:
    found = re.search(r"Final estimate: PPL = [0-9.]+ \+/- [0-9.]+", text)
    assert found, text[-2000:]
    return found.group(0)


@pytest.mark.parity
def test_default_output_and_base_file_equal_llama_cpp(bases):
    """Defaults on both sides (-fa auto: on): the same final estimate, and the same file byte for byte (the
    logits are bit-equal and the 16-bit encoding follows llama.cpp's float operations)."""
    d, ref, ours = bases
    assert _final(ours.stdout) == _final(ref.stdout + ref.stderr)
    assert (d / "ours.bin").read_bytes() == (d / "ref.bin").read_bytes()


def _figures(text: str) -> list[tuple[str, list[float], int]]:
    """(label, numbers, decimals of the last) per per-chunk row and statistics line."""
    rows = []
    for line in text.splitlines():
        if line.endswith("minutes"):  # llama.cpp's ETA line ends on stdout
            continue
        if re.match(r"^ +\d+ +[0-9.]+ ± ", line) or re.match(
            r"^(Mean|Maximum|Minimum|Median|Cor|RMS|Same| ?\d)", line
        ):
            nums = re.findall(r"-?\d+\.(\d+)", line)
            values = [float(v) for v in re.findall(r"-?\d+\.\d+", line)]
            if values:
                rows.append((re.sub(r"-?\d+\.\d+", "#", line).strip(), values, len(nums[-1])))
    return rows


@pytest.mark.parity
def test_kl_divergence_figures_equal_llama_cpp(bases, smollm2_path):
    """Each tool compares the model without flash attention against the other tool's file: every figure
    equal to the printed digits, give or take one unit in the last one (llama.cpp adds its per-thread sums
    in whatever order its threads finish, so its own last digit can move between runs)."""
    d, _, _ = bases
    common = ["-m", str(smollm2_path), *ARGS, "-fa", "off", "--kl-divergence"]
    ref = _reference(*common, "--kl-divergence-base", str(d / "ours.bin"))
    ours = _ours(*common, "--kl-divergence-base", str(d / "ref.bin"))
    a, b = _figures(ref.stdout), _figures(ours.stdout)
    assert len(a) == 4 + 6 + 12 + 16, ref.stdout  # 4 chunk rows, then llama.cpp's three statistics blocks
    assert [r[0] for r in a] == [r[0] for r in b]
    for (label, want, dec), (_, got, _) in zip(a, b, strict=True):
        for x, y in zip(want, got, strict=True):
            assert abs(x - y) <= 1.01 * 10.0**-dec, (label, want, got)
    assert "Same top p" in ours.stdout and "100.000" not in ours.stdout.split("Same top p")[1][:12]
