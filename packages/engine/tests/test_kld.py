"""llama-perplexity's KL-divergence mode on a tiny model: the base file's layout, a model compared with its
own logits, llama.cpp's messages for files that do not fit, and the -fa option."""

from __future__ import annotations

import math
import re
import struct
import subprocess

import numpy as np
import pytest
from cli_tools import run_ours
from tiny_models import N_VOCAB, write_tiny_model

from llama_engine.chunked import ChunkProgress, chunk_logits, load
from llama_engine.kld import KldStats, encode_rows, row_width

TEXT = " ".join(f"word{i % 37} and more text {i}" for i in range(120))
N_CTX, N_CHUNKS = 32, 8  # 8 * 15 = 120 scored positions: the closing statistics need 100


def _ppl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_ours("perplexity", *args)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("kld")
    model = write_tiny_model(d / "m.gguf", "llama")
    (d / "t.txt").write_text(TEXT)
    args = ["-m", str(model), "-c", str(N_CTX), "-b", str(2 * N_CTX)]
    r = _ppl(
        *args, "-f", str(d / "t.txt"), "--chunks", str(N_CHUNKS), "--kl-divergence-base", str(d / "b.bin")
    )
    assert r.returncode == 0, r.stderr
    return d, model, args, r


def test_base_file_layout(base):
    d, model, _, r = base
    raw = (d / "b.bin").read_bytes()
    assert raw[:8] == b"_logits_"
    n_ctx, n_vocab, n_chunk = struct.unpack("<iii", raw[8:20])
    assert (n_ctx, n_vocab, n_chunk) == (N_CTX, N_VOCAB, N_CHUNKS)
    m = load(model)
    tokens = m.tokenizer.encode(TEXT, add_special=True)
    stored = np.frombuffer(raw[20 : 20 + 4 * n_ctx * n_chunk], np.int32)
    assert stored.tolist() == tokens[: n_ctx * n_chunk]
    nv, n_rows = row_width(N_VOCAB), n_ctx - 1 - n_ctx // 2
    assert nv == N_VOCAB + 1 + 4  # odd vocabulary: one padding value
    body = np.frombuffer(raw[20 + 4 * n_ctx * n_chunk :], np.uint16)
    assert len(body) == n_chunk * n_rows * nv
    rows = body.reshape(n_chunk, n_rows, nv)
    assert not rows[:, :, -1].any()
    # the rows decode to the log-probabilities of the model's logits (flash attention: the default)
    _, logits = next(chunk_logits(m, tokens, n_ctx, 2 * n_ctx, 2, n_ctx // 2, True))
    x = logits[0][:n_rows].astype(np.float64)
    lp = x - x.max(1, keepdims=True) - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
    head = rows[0, :, :4].copy().view(np.float32)
    decoded = head[:, 1:2] + head[:, :1] * rows[0, :, 4 : 4 + N_VOCAB]
    keep = lp > lp.max(1, keepdims=True) - 15
    assert np.abs(decoded - lp)[keep].max() <= head[:, 0].max()
    assert "saving all logits to" in r.stderr and "Final estimate: PPL = " in r.stdout


def test_same_model_against_its_own_logits(base):
    d, _, args, r = base
    out = _ppl(*args, "--kl-divergence", "--kl-divergence-base", str(d / "b.bin"))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "kl_divergence: computing over 8 chunks, n_ctx=32, batch_size=64, n_seq=2" in out.stderr
    assert re.search(r"^   8 +[0-9.]+ ± +[0-9.]+ +-?[0-9.]+ ± ", text, re.M), text
    assert "Same top p: 100.000 ± 0.000 %" in text
    kld = float(re.search(r"Mean    KLD: +(-?[0-9.]+)", text).group(1))
    assert abs(kld) < 1e-4  # only the 16-bit rounding of the stored log-probabilities
    ppl_q = float(re.search(r"Mean PPL\(Q\) +: +([0-9.]+)", text).group(1))
    ppl_base = float(re.search(r"Mean PPL\(base\) +: +([0-9.]+)", text).group(1))
    final = float(re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout).group(1))
    assert math.isclose(ppl_q, final, rel_tol=1e-6) and math.isclose(ppl_base, final, rel_tol=1e-3)
    for label in ("Maximum KLD", "99.9%   KLD", "Median  KLD", "Minimum KLD", "RMS Δp    ", "Median  Δp"):
        assert label in text


def _patched(d, name: str, offset: int, value: int) -> str:
    raw = bytearray((d / "b.bin").read_bytes())
    raw[offset : offset + 4] = struct.pack("<i", value)
    (d / name).write_bytes(bytes(raw))
    return str(d / name)


def test_files_that_do_not_fit(base):
    d, _, args, _ = base
    (d / "junk.bin").write_bytes(b"not a logits file at all")
    (d / "short.bin").write_bytes((d / "b.bin").read_bytes()[:-100])
    cases = [
        ([], "kl_divergence: you must provide a name of a file containing the log probabilities of the base model"),
        (["--kl-divergence-base", str(d / "none.bin")], f"kl_divergence: failed to open {d / 'none.bin'}"),
        (["--kl-divergence-base", str(d / "junk.bin")], "does not look like a file containing log-probabilities"),
        (["--kl-divergence-base", _patched(d, "v.bin", 12, 49152)], f"inconsistent vocabulary (49152 vs {N_VOCAB})"),
        (["--kl-divergence-base", str(d / "short.bin")], "kl_divergence: failed reading log-probs for chunk 7"),
    ]  # fmt: skip
    for extra, message in cases:
        r = _ppl(*args, "--kl-divergence", *extra)
        assert r.returncode == 1 and message in r.stderr, (extra, r.stderr[-500:])
        assert "Traceback" not in r.stderr
    # a base file computed with a larger context than -c
    small = [a if a != str(N_CTX) else "16" for a in args]
    r = _ppl(*small, "--kl-divergence", "--kl-divergence-base", str(d / "b.bin"))
    assert r.returncode == 1, r.stderr
    assert (
        f"kl_divergence: {d / 'b.bin'} has been computed with 32, while the current context is 16. "
        "Increase it with -c and retry" in r.stderr
    )


def test_flash_attn_values(base):
    d, _, args, _ = base
    r = _ppl(*args, "-f", str(d / "t.txt"), "-fa", "maybe")
    assert r.returncode == 2 and "unknown value for --flash-attn: 'maybe'" in r.stderr
    # off and on differ (another accumulation order), auto is on
    outs = {}
    for fa in ("off", "on", "auto"):
        r = _ppl(*args, "-f", str(d / "t.txt"), "--chunks", "2", "-fa", fa)
        assert r.returncode == 0, r.stderr
        outs[fa] = r.stdout
    assert outs["auto"] == outs["on"]
    assert "Final estimate" in outs["off"]


def test_encode_rows_rounding_and_flat_rows():
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 4, (3, 7)).astype(np.float32)
    logits[2] = 1.5  # every logit equal: scale 0, all values 0
    out = np.zeros((3, row_width(7)), np.uint16)
    nll = encode_rows(logits, np.array([0, 3, 6]), out)
    head = out[:, :4].copy().view(np.float32)
    assert head[2, 0] == 0 and not out[2, 4:].any() and math.isclose(nll[2], math.log(7), rel_tol=1e-6)
    for r in range(2):
        x = logits[r]
        mn = max(x.min(), x.max() - np.float32(16))
        scale = (x.max() - mn) / np.float32(65535)
        want = np.where(x > mn, np.rint((np.float32(1) / scale) * (x - mn)), 0)
        assert head[r, 0] == scale
        np.testing.assert_array_equal(out[r, 4:11], want)
        assert out[r, 4:11].max() == 65535


def test_stats_percentiles_follow_llama_cpp():
    s = KldStats()
    s.kld = [np.array([0.4, 0.1, 0.3, 0.2], np.float32)]
    s.p_diff = [np.array([-0.1, 0.2, 0.0, 0.1], np.float32)]
    s.counts[:] = (3, 100)
    s.sums[5], s.sums[6] = 10.0, 2.0
    lines = s.report()
    assert "Median  KLD:   0.250000" in lines and "Maximum KLD:   0.400000" in lines
    assert "90.0%   KLD:   0.370000" in lines  # 0.9 * 3 = 2.7 between the third and fourth value
    assert "Same top p:  3.000 ± 1.714 %" in lines


def test_progress_plain_and_bar(capsys):
    p = ChunkProgress("perplexity", 4, 128, tty=False)
    p.update(2)
    assert capsys.readouterr().err.startswith("perplexity: chunk 2/4, ")
    bar = ChunkProgress("perplexity", 4, 128, tty=True)
    bar.update(2)
    bar.erase()
    err = capsys.readouterr().err
    assert "[##########..........] chunk 2/4" in err and err.endswith("\033[K")
