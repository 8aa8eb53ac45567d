"""gpt-oss against llama.cpp's generic build (`nox -s parity`).

Tiny random-weight models written with gguf-io in the released files' layout: MXFP4 experts (F16 and Q8_0
variants too), Q/K/V/O biases, attention sinks, the router's and the experts' biases, alternating
sliding-window (4 tokens) and full layers, YaRN RoPE (x32 from 4,096 tokens). Tolerance: none. Logits
equal to the bit on a prompt and every greedy step, with f32 and f16 caches, with flash attention on and
off (ggml's one-token kernel, its tiled kernel on a long prompt, the mul_mat path of a bf16 cache), for
several sequences decoded in one batch, and greedy text through the scheduler with three slots and after a
slot's state is saved, erased and restored.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from arch_parity import N_STEPS, SEQS, check_batched, check_three_slots_and_restore
from test_engine_parity import Oracle, _check_greedy
from test_kv_types_parity import PROMPT, TypedOracle, _check
from tiny_models import GPT_OSS_WINDOW, write_tiny_model

from gguf_io import GGMLQuantizationType as T
from gguf_io import open as open_gguf
from llama_engine import LLM
from llama_engine.arch import load_model
from llama_engine.arch.gpt_oss import GptOss
from llama_engine.batch import Batch
from llama_engine.layers import MoE

pytestmark = pytest.mark.parity

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def _write(d: Path, expert_type: str) -> Path:
    return write_tiny_model(d / f"gpt-oss-{expert_type}.gguf", "gpt-oss", seed=5, expert_qtype=T[expert_type])


@pytest.fixture(scope="module")
def mxfp4_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("gpt-oss"), "MXFP4")


@pytest.fixture(scope="module")
def mxfp4_model(mxfp4_path: Path) -> GptOss:
    model = load_model(open_gguf(mxfp4_path), kernels="portable")
    assert isinstance(model, GptOss)
    return model


@pytest.mark.parametrize("expert_type", ["MXFP4", "F16", "Q8_0"])
def test_greedy_text_and_logits_equal_llama_cpp(expert_type: str, tmp_path: Path) -> None:
    path = _write(tmp_path, expert_type)
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        model = llm.engine.model
        assert all(isinstance(lw.ffn, MoE) and lw.sinks is not None for lw in model.layers)
        assert model.config.swa_layers == frozenset(range(0, model.config.n_layer, 2))
        _check_greedy(llm, Oracle(path, "f32"), PROMPTS[0])


def test_f16_cache_greedy_text_and_logits_equal_llama_cpp(mxfp4_path: Path) -> None:
    with LLM(mxfp4_path, n_ctx=512, n_parallel=1) as llm:  # the default cache type, f16
        _check_greedy(llm, Oracle(mxfp4_path, "f16"), PROMPTS[1])


# (type_k, type_v, flash attention): flash attention's one-chunk kernel on f16 and f32 caches and a
# quantized K, and the typed mul_mat path (bf16)
CACHES = [("f16", "f16", "on"), ("f32", "f32", "on"), ("q8_0", "f16", "on"), ("bf16", "bf16", "off")]


@pytest.mark.parametrize(("type_k", "type_v", "fa"), CACHES)
def test_cache_types_and_flash_attention_equal_llama_cpp(
    mxfp4_path: Path, mxfp4_model: GptOss, type_k: str, type_v: str, fa: str
) -> None:
    _check(mxfp4_path, mxfp4_model, type_k, type_v, fa, n_gen=6)


def test_tiled_flash_attention_on_a_long_prompt(mxfp4_path: Path, mxfp4_model: GptOss) -> None:
    """80 tokens: ggml's tiled flash-attention kernel, its sinks applied after the last tile."""
    _check(mxfp4_path, mxfp4_model, "f16", "f16", "on", n_gen=4, prompt=PROMPT * 4)


@pytest.mark.parametrize(("cache", "flash"), [("f32", False), ("f16", True)])
def test_batched_sequences_logits_equal_llama_cpp(
    mxfp4_path: Path, mxfp4_model: GptOss, cache: str, flash: bool
) -> None:
    """Three sequences' prompts in one batch, then their decode tokens in one batch per step: each row
    equals llama.cpp's logits for that sequence alone, past the sliding window."""
    assert max(len(s) for s in SEQS) > GPT_OSS_WINDOW
    oracle = TypedOracle(mxfp4_path, cache, cache, flash)
    try:
        expected = [oracle.greedy(s, N_STEPS) for s in SEQS]
    finally:
        oracle.close()
    model = mxfp4_model
    kv = model.make_kv_cache(256, n_seq_max=len(SEQS), type_k=cache, type_v=cache, flash_attn=flash)
    check_batched(model, kv, expected)


def test_scheduler_with_three_slots_and_slot_restore_equal_llama_cpp(
    mxfp4_path: Path, tmp_path: Path
) -> None:
    check_three_slots_and_restore(mxfp4_path, tmp_path)


def test_sinks_and_swiglu_clamp_take_part(mxfp4_model: GptOss) -> None:
    """The tiny model reaches what the parity above checks: without its sinks the logits change, and the
    experts' gate and up values pass swiglu_oai's limit of 7."""
    model = mxfp4_model
    ids = [i % model.config.n_vocab for i in PROMPT[:12]]
    kv = model.make_kv_cache(64, type_k="f32", type_v="f32")
    with_sinks = model.forward(Batch.single(ids), kv)[0].copy()
    saved = [lw.sinks for lw in model.layers]
    try:
        for lw in model.layers:
            lw.sinks = None
        kv.clear()
        without = model.forward(Batch.single(ids), kv)[0]
        assert np.abs(with_sinks - without).max() > 1e-3
    finally:
        for lw, s in zip(model.layers, saved, strict=True):
            lw.sinks = s
    b = model.workspace(1).moe
    assert b is not None and np.abs(b.gu).max() > 7.0
