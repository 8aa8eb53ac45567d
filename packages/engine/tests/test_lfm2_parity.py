"""lfm2 (short-convolution layers mixed with attention layers) against llama.cpp's generic build (`nox -s
parity`).

A tiny random-weight model written with gguf-io: seven layers, attention at 2 and 5, the others short
convolutions of three taps whose state lives in the memory's recurrent pool. Tolerance: none. Logits
equal to the bit on a prompt and every greedy step, for several sequences decoded in one batch, through
the scheduler with three slots, and after a slot's state is saved, erased and restored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_engine_parity import Oracle, _check_greedy
from tiny_models import LFM2_ATTN_LAYERS, write_tiny_model

from gguf_io import open as open_gguf
from llama_engine import LLM, Engine, EngineConfig, GenerationRequest, SamplingParams
from llama_engine.arch import load_model
from llama_engine.batch import Batch
from llama_engine.layers import ShortConv
from llama_engine.requests import FinalEvent, TokenEvent

pytestmark = pytest.mark.parity

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
SEQS = [[256, *range(40, 52)], [256, 7, 99, 140, 33], [256, *range(200, 230, 3)]]
N_STEPS = 10
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("lfm2") / "lfm2.gguf", "lfm2", seed=4)


@pytest.fixture(scope="module")
def pair(path: Path) -> Iterator[tuple]:
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        yield llm, Oracle(path, "f32")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_and_logits_equal_llama_cpp(pair: tuple, prompt: str) -> None:
    model = pair[0].engine.model
    kinds = [isinstance(layer.mixer, ShortConv) for layer in model.layers]
    assert kinds == [il not in LFM2_ATTN_LAYERS for il in range(len(kinds))]
    _check_greedy(*pair, prompt)


def test_batched_sequences_logits_equal_llama_cpp(path: Path) -> None:
    """Three sequences' prompts in one batch, then their decode tokens in one batch per step: each row
    equals llama.cpp's logits for that sequence alone (each sequence's conv state its own)."""
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


def _tokens(handle) -> tuple[list[int], FinalEvent]:  # type: ignore[no-untyped-def]
    events = list(handle)
    final = events[-1]
    assert isinstance(final, FinalEvent) and not final.error
    return [e.token for e in events if isinstance(e, TokenEvent)], final


def _same_greedy(got: list[int], want: list[int]) -> None:
    assert got == want or got == want[:-1], (got, want)


def test_scheduler_with_three_slots_and_slot_restore_equal_llama_cpp(path: Path, tmp_path: Path) -> None:
    """Three requests decoded together by the scheduler give llama.cpp's greedy text for each; a slot
    saved, erased and restored continues from the restored conv state: a prompt extending the slot's
    tokens reuses all of them and gives llama.cpp's text for the whole prompt."""
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
        assert final.usage.cached_tokens == len(cached)  # the restored state served the prompt
        _same_greedy(got, oracle.greedy(longer, 6)[0])
    finally:
        engine.shutdown()
