"""`gguf-io info` and `gguf-io dump --json`, run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gguf_io.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_info_smollm2(smollm2_path: str) -> None:
    r = run("info", smollm2_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "llama 'Smollm2 135M 8k Lc100K Mix1 Ep2'  layers=30 embd=576 heads=9/3" in out
    assert "tokenizer.ggml.tokens" in out and "(49152 items)" in out
    assert "blk.0.attn_q.weight" in out and "Q4_1" in out
    assert "totals per type:" in out and "  all        272 tensors" in out
    assert len(out.splitlines()) < 400  # long arrays are abbreviated


def test_dump_json_gemma3(gemma3_path: str) -> None:
    r = run("dump", "--json", gemma3_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["version"] == 3 and len(doc["tensors"]) == 236
    assert doc["metadata"]["general.architecture"] == {"type": "STRING", "value": "gemma3"}
    assert doc["metadata"]["tokenizer.ggml.scores"]["array_type"] == "FLOAT32"
    assert len(doc["metadata"]["tokenizer.ggml.tokens"]["value"]) == 262144
    assert "token_embd.weight" in {t["name"] for t in doc["tensors"]}


def test_bad_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x01\0\0\0")
    r = run("info", str(bad))
    assert r.returncode == 1
    assert r.stderr.startswith("gguf-io: error: ") and "version 1" in r.stderr
    assert "Traceback" not in r.stderr
