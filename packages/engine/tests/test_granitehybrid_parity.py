"""granitehybrid (Mamba-2 layers mixed with attention layers) against llama.cpp's generic build (`nox -s
parity`).

Tiny random-weight models written with gguf-io: seven layers, attention at 1 and 4, the others Mamba-2
blocks (two groups, eight heads) whose conv and SSM states live in the memory's recurrent pool; Granite's
four multipliers set. One model has a dense FFN, one a mixture of experts with a shared expert and no
RoPE (``rope.scaling.finetuned`` false). Tolerance: none. Logits equal to the bit on a prompt and every
greedy step, for several sequences decoded in one batch, through the scheduler with three slots, and
after a slot's state is saved, erased and restored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_engine_parity import Oracle, _check_greedy
from test_lfm2_parity import _same_greedy, _tokens
from tiny_models import GRANITE_ATTN_LAYERS, write_tiny_model

from gguf_io import GGUFValueType, GGUFWriter
from gguf_io import open as open_gguf
from llama_engine import LLM, Engine, EngineConfig, GenerationRequest, SamplingParams
from llama_engine.arch import load_model
from llama_engine.batch import Batch
from llama_engine.layers import Mamba2, MoE

pytestmark = pytest.mark.parity

SEQS = [[256, *range(40, 52)], [256, 7, 99, 140, 33], [256, *range(200, 230, 3)]]
N_STEPS = 8
GREEDY = SamplingParams(temperature=0.0)


def _no_rope(w: GGUFWriter, rng: np.random.Generator) -> None:
    w.add_metadata("granitehybrid.rope.scaling.finetuned", False, GGUFValueType.BOOL)


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("granite") / "dense.gguf", "granitehybrid", seed=5)


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("granite") / "moe.gguf"
    return write_tiny_model(out, "granitehybrid", seed=6, moe=True, extra=_no_rope)


@pytest.fixture(scope="module")
def pair(path: Path) -> Iterator[tuple]:
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        yield llm, Oracle(path, "f32")


def test_greedy_text_and_logits_equal_llama_cpp(pair: tuple) -> None:
    model = pair[0].engine.model
    kinds = [isinstance(layer.mixer, Mamba2) for layer in model.layers]
    assert kinds == [il not in GRANITE_ATTN_LAYERS for il in range(len(kinds))]
    _check_greedy(*pair, "The capital of France is")


def _batched(path: Path):  # type: ignore[no-untyped-def]
    """Three sequences' prompts in one batch, then their decode tokens in one batch per step: each row
    equals llama.cpp's logits for that sequence alone (each sequence's states its own)."""
    oracle = Oracle(path, "f32")
    expected = [oracle.greedy(s, N_STEPS) for s in SEQS]
    model = load_model(open_gguf(path))
    kv = model.make_kv_cache(512, n_seq_max=len(SEQS), type_k="f32", type_v="f32")
    logits, _ = model.forward(Batch.concat([Batch.single(s, i) for i, s in enumerate(SEQS)]), kv)
    live = list(range(len(SEQS)))
    for step in range(N_STEPS):
        for row, i in enumerate(live):
            np.testing.assert_array_equal(logits[row], expected[i][1][step])
        live = [i for i in live if step + 1 < len(expected[i][1])]
        if not live:
            break
        parts = [Batch.single([expected[i][0][step]], i, len(SEQS[i]) + step) for i in live]
        logits, _ = model.forward(Batch.concat(parts), kv)
    assert sum(len(ref) == N_STEPS for _, ref in expected) > 1  # several decoded together to the end
    return model


def test_batched_sequences_logits_equal_llama_cpp(path: Path) -> None:
    _batched(path)


def test_experts_with_shared_expert_and_no_rope_equal_llama_cpp(moe_path: Path) -> None:
    model = _batched(moe_path)
    ffns = [layer.ffn for layer in model.layers]
    assert all(isinstance(f, MoE) and f.shared is not None and f.shared_gate is None for f in ffns)
    assert model.rope_dims(GRANITE_ATTN_LAYERS[0]) == 0


def test_scheduler_with_three_slots_and_slot_restore_equal_llama_cpp(path: Path, tmp_path: Path) -> None:
    """Three requests decoded together by the scheduler give llama.cpp's greedy text for each; a slot
    saved, erased and restored continues from the restored conv and SSM states: a prompt extending the
    slot's tokens reuses all of them and gives llama.cpp's text for the whole prompt."""
    oracle = Oracle(path, "f32")
    expected = [oracle.greedy(s, N_STEPS)[0] for s in SEQS]
    cfg = EngineConfig(
        n_ctx=512, n_parallel=3, n_batch=64, warmup=False, cache_type_k="f32", cache_type_v="f32"
    )
    engine = Engine(path, cfg).start()
    engine.wait_ready()
    try:
        handles = [
            engine.submit(GenerationRequest(prompt=s, max_tokens=N_STEPS, sampling=GREEDY, slot=i))
            for i, s in enumerate(SEQS)
        ]
        for handle, want in zip(handles, expected, strict=True):
            _same_greedy(_tokens(handle)[0], want)
        cached = list(engine.scheduler.slots[0].tokens)
        saved = engine.save_slot(0, tmp_path / "slot0.bin")
        assert saved.n_tokens == len(cached)
        assert engine.erase_slot(0) == saved.n_tokens
        engine.restore_slot(0, tmp_path / "slot0.bin")
        longer = [*cached, expected[0][len(cached) - len(SEQS[0])], 60, 61, 62]
        got, final = _tokens(
            engine.submit(GenerationRequest(prompt=longer, max_tokens=6, sampling=GREEDY, slot=0))
        )
        assert final.usage.cached_tokens == len(cached)  # the restored states served the prompt
        _same_greedy(got, oracle.greedy(longer, 6)[0])
    finally:
        engine.shutdown()
