"""The parity checks every architecture's test module runs on its tiny model (`nox -s parity`): several
sequences decoded in one batch, and the scheduler with three slots and a slot saved, erased and restored,
each against llama.cpp's logits or greedy text for the sequences alone. A module states its model and
cases and calls these."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from test_engine_parity import Oracle

from gguf_io import open as open_gguf
from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from llama_engine.arch import DecoderModel, load_model
from llama_engine.batch import Batch
from llama_engine.kv_cache import KVCache
from llama_engine.requests import FinalEvent, TokenEvent

SEQS = [[256, *range(40, 52)], [256, 7, 99, 140, 33], [256, *range(200, 230, 3)]]
N_STEPS = 10
GREEDY = SamplingParams(temperature=0.0)


def check_batched(model: DecoderModel, kv: KVCache, expected: list, n_steps: int = N_STEPS) -> None:
    """``SEQS``' prompts in one batch, then their decode tokens in one batch per step: each row equals
    ``expected[i]`` (llama.cpp's greedy tokens and logits for sequence i alone)."""
    logits, _ = model.forward(Batch.concat([Batch.single(s, i) for i, s in enumerate(SEQS)]), kv)
    live = list(range(len(SEQS)))  # the sequences still decoding (llama.cpp stops at end-of-generation)
    for step in range(n_steps):
        for row, i in enumerate(live):
            np.testing.assert_array_equal(logits[row], expected[i][1][step])
        live = [i for i in live if step + 1 < len(expected[i][1])]
        if not live:
            break
        parts = [Batch.single([expected[i][0][step]], i, len(SEQS[i]) + step) for i in live]
        logits, _ = model.forward(Batch.concat(parts), kv)
    assert sum(len(ref) == n_steps for _, ref in expected) > 1  # several decoded together to the end


def check_batched_sequences(
    path: Path, n_steps: int = N_STEPS, n_ctx: int = 512, kernels: str | None = None
) -> DecoderModel:
    """`check_batched` on the model at ``path`` with an f32 cache of ``n_ctx`` cells; returns the model."""
    oracle = Oracle(path, "f32")
    expected = [oracle.greedy(s, n_steps) for s in SEQS]
    model = load_model(open_gguf(path), kernels=kernels)
    kv = model.make_kv_cache(n_ctx, n_seq_max=len(SEQS), type_k="f32", type_v="f32")
    check_batched(model, kv, expected, n_steps)
    return model


def start_engine(path: Path) -> Engine:
    cfg = EngineConfig(
        n_ctx=512, n_parallel=3, n_batch=64, warmup=False, cache_type_k="f32", cache_type_v="f32"
    )
    engine = Engine(path, cfg).start()
    engine.wait_ready()
    return engine


def tokens(handle) -> tuple[list[int], FinalEvent]:  # type: ignore[no-untyped-def]
    events = list(handle)
    final = events[-1]
    assert isinstance(final, FinalEvent) and not final.error
    return [e.token for e in events if isinstance(e, TokenEvent)], final


def same_greedy(got: list[int], want: list[int]) -> None:
    """The engine's greedy tokens are llama.cpp's (the end-of-generation token that ends them may be left
    out of the events)."""
    assert got == want or got == want[:-1], (got, want)


def check_three_slots_and_restore(
    path: Path, tmp_path: Path, n_steps: int = N_STEPS, recurrent: bool = False
) -> None:
    """Three requests decoded together by the scheduler give llama.cpp's greedy text for each; slot 0 is
    then saved, erased and restored. A KV cache serves the same prompt again from the restored cells and
    continues the same; a ``recurrent`` model, whose state cannot be cut back, continues from the restored
    state: a prompt extending the slot's tokens reuses all of them and gives llama.cpp's text for it."""
    oracle = Oracle(path, "f32")
    expected = [oracle.greedy(s, n_steps)[0] for s in SEQS]
    engine = start_engine(path)
    try:
        handles = [
            engine.submit(GenerationRequest(prompt=s, max_tokens=n_steps, sampling=GREEDY, slot=i))
            for i, s in enumerate(SEQS)
        ]
        for handle, want in zip(handles, expected, strict=True):
            same_greedy(tokens(handle)[0], want)
        cached = list(engine.scheduler.slots[0].tokens)
        saved = engine.save_slot(0, tmp_path / "slot0.bin")
        if recurrent:
            assert saved.n_tokens == len(cached)
        assert engine.erase_slot(0) == saved.n_tokens
        engine.restore_slot(0, tmp_path / "slot0.bin")
        if recurrent:
            longer = [*cached, expected[0][len(cached) - len(SEQS[0])], 60, 61, 62]
            req = GenerationRequest(prompt=longer, max_tokens=6, sampling=GREEDY, slot=0)
            got, final = tokens(engine.submit(req))
            assert final.usage.cached_tokens == len(cached)  # the restored state served the prompt
            same_greedy(got, oracle.greedy(longer, 6)[0])
        else:
            req = GenerationRequest(prompt=SEQS[0], max_tokens=n_steps, sampling=GREEDY, slot=0)
            got, final = tokens(engine.submit(req))
            assert final.usage.cached_tokens == len(SEQS[0]) - 1  # the restored cells served the prompt
            same_greedy(got, expected[0])
    finally:
        engine.shutdown()
