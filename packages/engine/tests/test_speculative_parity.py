"""Greedy tokens with drafting equal llama.cpp's own greedy tokens on the F16 SmolLM2 (`nox -s parity`).

The target is SmolLM2 converted to F16 with llama-quant (once per machine, under ~/.cache/llama-py/), the
draft the packaged Q4_1 file; several n-min/n-max pairs, each against llama.cpp's portable build.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from test_engine_parity import Oracle

from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams, TokenEvent
from llama_engine.speculative import DraftParams, SpecType, SpeculativeConfig

pytestmark = pytest.mark.parity

PROMPT = "<|im_start|>user\nWrite a python function that adds two numbers.<|im_end|>\n<|im_start|>assistant\n"
N_GEN = 48


@pytest.fixture(scope="module")
def smollm2_f16(smollm2_path: Path) -> Path:
    out = Path.home() / ".cache" / "llama-py" / "smollm2-f16" / "SmolLM2-135M-Instruct.F16.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        exe = shutil.which("llama-quant") or "llama-quant"
        subprocess.run([exe, "--allow-requantize", str(smollm2_path), str(tmp), "F16"], check=True)
        tmp.rename(out)
    return out


@pytest.fixture(scope="module")
def reference(smollm2_f16: Path) -> tuple[list[int], list[int]]:
    engine = Engine(smollm2_f16, EngineConfig(n_ctx=512, warmup=False))
    prompt = engine.tokenizer.encode(PROMPT, parse_special=True)
    tokens, _ = Oracle(smollm2_f16, kv_type="f16").greedy(prompt, N_GEN)
    return prompt, tokens


@pytest.mark.parametrize(("n_min", "n_max"), [(0, 3), (4, 8), (1, 16)])
def test_drafted_greedy_tokens_equal_llama_cpp(smollm2_f16, smollm2_path, reference, n_min, n_max) -> None:
    prompt, expected = reference
    spec = SpeculativeConfig(
        types=(SpecType.DRAFT_SIMPLE,), draft=DraftParams(model=str(smollm2_path), n_min=n_min, n_max=n_max)
    )
    engine = Engine(smollm2_f16, EngineConfig(n_ctx=512, n_batch=64, speculative=spec)).start()
    try:
        h = engine.submit(
            GenerationRequest(prompt=prompt, max_tokens=N_GEN, sampling=SamplingParams(temperature=0.0))
        )
        tokens = [ev.token for ev in h if isinstance(ev, TokenEvent)]
    finally:
        engine.shutdown()
    # llama.cpp's greedy loop ends on an end-of-generation token, which the engine does not emit
    assert tokens == (expected[:-1] if len(expected) < N_GEN else expected)
    assert h.final is not None and h.final.timings.draft_n_accepted > 0
