"""LoRA adapters against llama.cpp itself (run by `nox -s parity`): SmolLM2 with random low-rank adapters on
its attention and FFN weights, f32 and f16 adapter tensors, scales other than 1 and alpha/rank scaling.
Tolerance: none, the logits of the prompt and of every greedy step equal to the bit."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np
import pytest
from lora_adapters import write_lora
from test_engine_parity import Oracle

from gguf_io import GGMLQuantizationType
from gguf_io import open as open_gguf
from llama_engine.arch import load_model
from llama_engine.batch import Batch
from llama_engine.lora import load_lora

pytestmark = pytest.mark.parity

PROMPT = [1, 504, 3458, 282, 4649, 314, 253, 1345, 30]  # token ids of SmolLM2's vocabulary
N_GEN = 12


class LoraOracle(Oracle):
    def __init__(self, path: str | os.PathLike[str], adapters: list[tuple[Path, float]]) -> None:
        super().__init__(path, "f32")
        lc = self.lc
        self.adapters = [lc.llama_adapter_lora_init(self.model, os.fsencode(p)) for p, _ in adapters]
        arr = (lc.llama_adapter_lora_p_ctypes * len(adapters))(*self.adapters)
        scales = (ctypes.c_float * len(adapters))(*[s for _, s in adapters])
        assert lc.llama_set_adapters_lora(self.ctx, arr, len(adapters), scales) == 0


def _ours(model_path: Path, adapters: list[tuple[Path, float]], expected: list[int]) -> list[np.ndarray]:
    model = load_model(open_gguf(model_path))
    model.loras = [(load_lora(p, model), s) for p, s in adapters]
    kv = model.make_kv_cache(512, type_k="f32", type_v="f32")
    logits, _ = model.forward(Batch.single(PROMPT), kv)
    out = [logits[0].copy()]
    for i, t in enumerate(expected[:-1]):
        logits, _ = model.forward(Batch.single([t], 0, len(PROMPT) + i), kv)
        out.append(logits[0].copy())
    return out


@pytest.mark.parametrize(
    "qtype,scale,alpha",
    [
        (GGMLQuantizationType.F32, 1.0, 16.0),
        (GGMLQuantizationType.F16, 0.7, 16.0),
        (GGMLQuantizationType.F16, 0.5, 0.0),
    ],
)
def test_lora_logits_equal_llamacpp(
    tmp_path: Path, smollm2_path: Path, qtype, scale: float, alpha: float
) -> None:
    lora = write_lora(tmp_path / "lora.gguf", smollm2_path, seed=7, qtype=qtype, alpha=alpha, scale=0.05)
    oracle = LoraOracle(smollm2_path, [(lora, scale)])
    expected, ref = oracle.greedy(PROMPT, N_GEN)
    ours = _ours(smollm2_path, [(lora, scale)], expected)
    plain = _ours(smollm2_path, [], expected[:1])
    assert np.abs(ours[0] - plain[0]).max() > 0.1  # the adapter changes the logits
    worst = max(float(np.abs(a - b).max()) for a, b in zip(ours, ref, strict=False))
    print(f"lora {qtype.name} scale {scale} alpha {alpha}: largest difference {worst}")
    assert worst == 0.0


def test_two_adapters_on_different_weights_equal_llamacpp(tmp_path: Path, smollm2_path: Path) -> None:
    """Two adapters at once, each on its own weights (one delta per product: the order of adds is fixed)."""
    a = write_lora(tmp_path / "a.gguf", smollm2_path, seed=1, targets=("attn_q", "attn_v", "ffn_down"))
    b = write_lora(tmp_path / "b.gguf", smollm2_path, seed=2, targets=("attn_k", "attn_output", "ffn_up"))
    adapters = [(a, 0.8), (b, 1.3)]
    expected, ref = LoraOracle(smollm2_path, adapters).greedy(PROMPT, N_GEN)
    ours = _ours(smollm2_path, adapters, expected)
    assert all(np.array_equal(x, y) for x, y in zip(ours, ref, strict=False))
