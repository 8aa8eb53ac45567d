"""The step contract, driven by hand: `schedule() -> model.forward -> postprocess` on a tiny real model.

No loop thread: the test thread plays the engine, so every step's plan can be checked.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from drive import handle_tokens
from tiny_models import write_tiny_model

from llama_engine import (
    Batch,
    EmbeddingHandle,
    EmbeddingRequest,
    Engine,
    EngineConfig,
    GenerationRequest,
    Pooling,
    RequestCancelledError,
    RequestHandle,
    SamplingParams,
    Step,
    StopReason,
)
from llama_engine.embedding import pool
from llama_engine.handles import Embed, Generate
from llama_engine.requests import FinalEvent
from llama_engine.slot import SlotState

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
BUDGET = 16


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    path = write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", "llama", seed=3)
    # not started: the test calls the scheduler and the model itself
    return Engine(path, EngineConfig(n_ctx=512, n_parallel=2, n_batch=BUDGET, warmup=False))


def _run(engine: Engine, step: Step) -> None:
    logits, hidden = engine.model.forward(step.batch, engine.kv)
    engine.scheduler.postprocess(step, logits, hidden)


def _plan(step: Step, seqs: list[int]) -> tuple[int, ...]:
    return tuple(step.n_tokens[q] for q in seqs)


def _alone(engine: Engine, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of one request with nothing else scheduled."""
    return _alone_with(engine, prompt, n, GREEDY)


def _reference_embedding(engine: Engine, prompt: list[int], pooling: Pooling) -> np.ndarray:
    seq = engine.scheduler.embd_seq
    _, hidden = engine.model.forward(Batch.single(prompt, seq, all_logits=True), engine.kv)
    engine.kv.seq_rm(seq)
    return pool(hidden, pooling, 2)


def test_decode_prompt_and_embedding_chunks_share_one_budget(engine: Engine) -> None:
    sched = engine.scheduler
    emb_seq = sched.embd_seq
    stream, long_prompt, embd_prompt = [256, 1, 2, 3, 4], [256, *range(10, 49)], [256, *range(60, 89)]
    h0 = RequestHandle()
    sched.add(
        Generate(GenerationRequest(prompt=stream, max_tokens=12, sampling=GREEDY, cache_prompt=False), h0)
    )
    sched.admit()
    first = sched.schedule()
    assert first is not None and first.seqs == [0] and first.n_tokens[0] == 5 and first.n_out[0] == 1
    _run(engine, first)
    assert sched.slots[0].state == SlotState.GENERATE

    # an embedding job, then a long prompt: they share the budget
    eh = EmbeddingHandle()
    sched.add(Embed(EmbeddingRequest(prompt=embd_prompt), eh))
    h1 = RequestHandle()
    sched.add(
        Generate(GenerationRequest(prompt=long_prompt, max_tokens=2, sampling=GREEDY, cache_prompt=False), h1)
    )
    sched.admit()
    plans = []
    while sched.slots[1].state != SlotState.IDLE or sched.embeddings:
        step = sched.schedule()
        assert step is not None
        assert sum(_plan(step, step.seqs)) == step.n_scheduled <= BUDGET
        assert step.seqs[0] == 0 and step.n_tokens[0] == 1 and step.n_out[0] == 1  # decode first
        plans.append(_plan(step, [0, 1, emb_seq]))
        _run(engine, step)
    # (decode, long prompt, embedding) per step: the 15 left after the decode token shared evenly, the
    # shorter remaining first (water-filling); once the prompt's rest fits in a short step (<= 32 tokens
    # here) it runs without the embedding every other step, so its first token comes sooner
    assert plans == [
        (1, 8, 7),
        (1, 15, 0),  # 32 left: alone
        (1, 7, 8),  # shared again
        (1, 10, 0),  # alone: the prompt's last chunk, whose last token gives the first generated token
        (1, 1, 14),  # the new stream's decode token, the embedding's rest but one
        (1, 0, 1),
    ]
    assert h1.final is not None and h1.final.usage.completion_tokens == 2
    # chunked under the budget, the embedding equals the whole input evaluated at once
    assert np.array_equal(eh.result(), _reference_embedding(engine, embd_prompt, Pooling.MEAN))
    assert engine.kv.seq_pos_max(emb_seq) == -1  # the scratch sequence is free again

    while (step := sched.schedule()) is not None:
        _run(engine, step)
    assert handle_tokens(h0) == _alone(
        engine, stream, 12
    )  # the stream's tokens did not depend on its company


@pytest.mark.parametrize("pooling", [Pooling.CLS, Pooling.LAST, Pooling.NONE])
def test_embedding_chunks_ask_only_for_the_rows_pooling_reads(engine: Engine, pooling: Pooling) -> None:
    sched = engine.scheduler
    prompt = [256, *range(100, 140)]  # 41 tokens: chunks of 16, 16, 9
    eh = EmbeddingHandle()
    sched.add(Embed(EmbeddingRequest(prompt=prompt, pooling=pooling), eh))
    outs = []
    while (step := sched.schedule()) is not None:
        outs.append((step.n_tokens[sched.embd_seq], step.n_out[sched.embd_seq]))
        _run(engine, step)
    expected_out = {Pooling.CLS: [1, 0, 0], Pooling.LAST: [0, 0, 1], Pooling.NONE: [16, 16, 9]}[pooling]
    assert outs == list(zip([16, 16, 9], expected_out, strict=True))
    assert np.array_equal(eh.result(), _reference_embedding(engine, prompt, pooling))


def test_drafts_are_verified_and_rejected_cells_dropped(engine: Engine) -> None:
    sched = engine.scheduler
    prompt = [256, 7, 8, 9]
    plain = _alone(engine, prompt, 10)
    h = RequestHandle()
    req = GenerationRequest(prompt=prompt, max_tokens=10, sampling=GREEDY, cache_prompt=False, slot=0)
    sched.add(Generate(req, h))
    sched.admit()
    step = sched.schedule()
    assert step is not None
    _run(engine, step)  # the prompt: plain[0] sampled
    s = sched.slots[0]
    s.drafts = [*plain[1:4], (plain[4] + 1) % 256]  # three right drafts, then a wrong one
    step = sched.schedule()
    assert step is not None and step.seqs == [0]
    assert step.n_tokens[0] == 5 and step.n_out[0] == 5 and step.drafts[0] == s.drafts
    _run(engine, step)
    # plain[1..3] accepted, plain[4] sampled where the wrong draft was: 4 tokens from one step
    assert s.n_generated == 5 and s.next_token == plain[4]
    assert engine.kv.seq_pos_max(0) + 1 == len(s.tokens) == len(prompt) + 4  # the wrong draft's cell is gone
    while (step := sched.schedule()) is not None:
        assert step.drafts[0] == []
        _run(engine, step)
    assert handle_tokens(h) == plain


def test_cancelled_requests_end_at_the_next_step(engine: Engine) -> None:
    sched = engine.scheduler
    h = RequestHandle()
    sched.add(Generate(GenerationRequest(prompt=[256, 5, 6], max_tokens=50, sampling=GREEDY), h))
    eh = EmbeddingHandle()
    sched.add(Embed(EmbeddingRequest(prompt=[256, *range(30, 70)]), eh))
    sched.admit()
    step = sched.schedule()
    assert step is not None
    _run(engine, step)
    assert not h.cancelled.is_set()
    h.cancel()
    eh.cancel()
    assert h.cancelled.is_set() and eh.cancelled.is_set()
    assert sched.schedule() is None  # both dropped before anything else runs
    assert isinstance(h.final, FinalEvent) and h.final.reason == StopReason.CANCELLED
    with pytest.raises(RequestCancelledError):
        eh.result()
    assert engine.kv.seq_pos_max(sched.embd_seq) == -1 and not sched.has_work


def test_out_of_cells_fails_the_newest_request(tmp_path: Path) -> None:
    """A full cache fails the newest running request (here the embedding); the older stream goes on."""
    path = write_tiny_model(tmp_path / "llama.gguf", "llama", seed=3)
    engine = Engine(path, EngineConfig(n_ctx=64, n_parallel=1, n_batch=16, warmup=False))
    sched = engine.scheduler
    h = RequestHandle()
    sched.add(Generate(GenerationRequest(prompt=[256, *range(1, 40)], max_tokens=20, sampling=GREEDY), h))
    eh = EmbeddingHandle()
    sched.add(Embed(EmbeddingRequest(prompt=[256, *range(50, 90)]), eh))
    sched.admit()
    while sched.has_work:
        engine.step()  # the loop's step: schedule, forward, postprocess (or undo and recover)
    with pytest.raises(RuntimeError, match="KV cache is full"):
        eh.result()
    assert h.final is not None and h.final.reason == StopReason.LENGTH and len(handle_tokens(h)) == 20


def test_embedding_rows_come_last_and_get_no_logits(engine: Engine) -> None:
    sched = engine.scheduler
    emb_seq = sched.embd_seq
    stream, prompt, embd_prompt = [256, 5, 6, 7], [256, 40, 41, 42, 43], [256, *range(90, 97)]
    want_stream = _alone(engine, stream, 4)
    want_embd = _reference_embedding(engine, embd_prompt, Pooling.MEAN)
    h0 = RequestHandle()
    sched.add(
        Generate(GenerationRequest(prompt=stream, max_tokens=4, sampling=GREEDY, cache_prompt=False), h0)
    )
    sched.admit()
    first = sched.schedule()
    assert first is not None
    _run(engine, first)
    # a prompt, then an embedding job: both fit the budget with the decode token
    h1 = RequestHandle()
    sched.add(
        Generate(GenerationRequest(prompt=prompt, max_tokens=1, sampling=GREEDY, cache_prompt=False), h1)
    )
    eh = EmbeddingHandle()
    sched.add(Embed(EmbeddingRequest(prompt=embd_prompt, pooling=Pooling.MEAN), eh))
    sched.admit()
    step = sched.schedule()
    assert step is not None and len(step.seqs) == 3 and step.seqs[2] == emb_seq  # decode, prompt, embedding
    assert _plan(step, step.seqs) == (1, 5, 8) and step.n_scheduled <= BUDGET
    # the embedding's 8 rows are last: logits only for the decode row and the prompt's last row
    assert step.batch.n_logits == 2 and step.out_offset[emb_seq] == 2
    logits, hidden = engine.model.forward(step.batch, engine.kv)
    assert logits.shape == (2, engine.model.config.n_vocab) and hidden.shape[0] == 10
    sched.postprocess(step, logits, hidden)
    while (step := sched.schedule()) is not None:
        _run(engine, step)
    assert np.array_equal(eh.result(), want_embd)
    assert handle_tokens(h0) == want_stream
    assert h1.final is not None and h1.final.reason == StopReason.LENGTH


def test_prompt_chunks_beside_decoding_streams_keep_to_the_prefill_cap(engine: Engine) -> None:
    sched = engine.scheduler
    long_prompt = [256, *range(100, 139)]
    want = _alone(engine, long_prompt, 2)
    h0 = RequestHandle()
    sched.add(Generate(GenerationRequest(prompt=[256, 9, 8], max_tokens=30, sampling=GREEDY), h0))
    sched.admit()
    step = sched.schedule()
    assert step is not None
    _run(engine, step)
    h1 = RequestHandle()
    sched.add(
        Generate(GenerationRequest(prompt=long_prompt, max_tokens=2, sampling=GREEDY, cache_prompt=False), h1)
    )
    sched.admit()
    sched.prefill_cap = 6
    try:
        sizes = []
        while h1.final is None:
            step = sched.schedule()
            assert step is not None
            decoding = [q for q in step.seqs if sched.slots[q].state == SlotState.GENERATE]
            prompt = [q for q in step.seqs if sched.slots[q].state == SlotState.PROMPT]
            if prompt:
                # with a stream decoding, a prompt chunk is at most the cap; alone it takes the budget
                sizes.append(step.n_tokens[prompt[0]])
                assert step.n_tokens[prompt[0]] <= (6 if decoding else BUDGET)
            _run(engine, step)
        assert sizes[0] == 6 and sum(sizes) == len(long_prompt)
        assert handle_tokens(h1) == want  # the same tokens as with whole chunks
    finally:
        sched.prefill_cap = BUDGET
        h0.cancel()
        while (step := sched.schedule()) is not None:
            _run(engine, step)


def test_the_engine_sizes_the_prefill_cap_from_measured_steps(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "llama.gguf", "llama", seed=4)
    engine = Engine(path, EngineConfig(n_ctx=512, n_batch=256, warmup=False, max_step_ms=50.0))
    engine.start()
    try:
        handle = engine.submit(GenerationRequest(prompt=[256, *range(1, 200)], max_tokens=2, sampling=GREEDY))
        assert isinstance(list(handle)[-1], FinalEvent)
        # one 200-token step was measured: the cap is what fits 50 ms at that cost, within [32, n_batch]
        cap = engine.scheduler.prefill_cap
        assert 32 <= cap <= 256
        assert cap == min(max(int(0.05 / engine._token_s), 32), 256)
    finally:
        engine.shutdown()


def test_a_short_prompt_is_not_held_behind_a_long_one(engine: Engine) -> None:
    """A short prompt arriving while another slot prefills a long one gets its first token from the next
    step (the budget is shared, and a prompt that finishes within a short step runs alone), and the long
    prompt keeps advancing; both give the tokens they give alone."""
    sched = engine.scheduler
    long_prompt, short = [256, *range(100, 199)], [256, 7, 8, 9]
    want_long, want_short = _alone(engine, long_prompt, 2), _alone(engine, short, 2)
    h0, h1 = RequestHandle(), RequestHandle()
    sched.add(
        Generate(GenerationRequest(prompt=long_prompt, max_tokens=2, sampling=GREEDY, cache_prompt=False), h0)
    )
    sched.admit()
    step = sched.schedule()
    assert step is not None and step.n_tokens[step.seqs[0]] == BUDGET
    _run(engine, step)
    sched.add(
        Generate(GenerationRequest(prompt=short, max_tokens=2, sampling=GREEDY, cache_prompt=False), h1)
    )
    sched.admit()
    got_short: list[int] = []
    plans = []
    while not got_short:
        step = sched.schedule()
        assert step is not None
        plans.append(tuple(step.n_tokens[q] for q in (0, 1)))
        _run(engine, step)
        got_short += handle_tokens(h1)
    assert plans == [(0, 4)]  # the very next step: the short prompt alone
    step = sched.schedule()
    assert step is not None and step.n_tokens[0] == BUDGET - 1  # the long prompt beside the decode token
    _run(engine, step)
    while (step := sched.schedule()) is not None:
        _run(engine, step)
    assert got_short + handle_tokens(h1) == want_short
    assert handle_tokens(h0) == want_long


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.9, seed=7, ignore_eos=True)])
def test_a_preempted_request_resumes_with_the_same_text(engine: Engine, sampling: SamplingParams) -> None:
    """Under the priority policy, a waiting request of higher priority (lower value) takes the slot of the
    newest lower-priority one; that one is parked with its sampler, re-evaluates its cache in a free slot
    later and produces exactly the tokens it produces alone (greedy and seeded sampling alike)."""
    sched = engine.scheduler
    first, second, urgent = [256, 5, 6, 7], [256, 11, 12, 13, 14], [256, 21, 22]
    want = [_alone(engine, p, 10) for p in (first, second)]
    want_sampled = _alone_with(engine, second, 10, sampling)
    sched.policy = "priority"
    try:
        h0, h1, h2 = RequestHandle(), RequestHandle(), RequestHandle()
        for p, h, prio, sp in ((first, h0, 3, GREEDY), (second, h1, 3, sampling)):
            req = GenerationRequest(prompt=p, max_tokens=10, sampling=sp, cache_prompt=False, priority=prio)
            sched.add(Generate(req, h))
        sched.admit()
        for _ in range(4):  # both generate a few tokens
            step = sched.schedule()
            assert step is not None
            _run(engine, step)
        urgent_req = GenerationRequest(prompt=urgent, max_tokens=3, sampling=GREEDY, priority=0)
        sched.add(Generate(urgent_req, h2))
        sched.admit()
        assert sched.n_preemptions == 1
        assert [s.request.priority if s.request else None for s in sched.slots].count(0) == 1
        assert len(sched.waiting) == 1 and sched.waiting[0].handle is h1  # the newer one was parked
        while (step := sched.schedule()) is not None or sched.waiting:
            if step is not None:
                _run(engine, step)
            sched.admit()
        assert h2.final is not None and h2.final.usage.completion_tokens == 3
        assert handle_tokens(h0) == want[0]
        assert h1.final is not None and h1.final.reason == StopReason.LENGTH
        assert h1.final.usage.prompt_tokens == len(second) and h1.final.usage.completion_tokens == 10
        assert handle_tokens(h1) == (want[1] if sampling is GREEDY else want_sampled)
    finally:
        sched.policy = "fcfs"
        sched.n_preemptions = 0


def test_fcfs_never_preempts(engine: Engine) -> None:
    sched = engine.scheduler
    hs = [RequestHandle() for _ in range(3)]
    for i, h in enumerate(hs):
        req = GenerationRequest(
            prompt=[256, 40 + i], max_tokens=2, sampling=GREEDY, priority=5 - 5 * (i == 2)
        )
        sched.add(Generate(req, h))
    sched.admit()
    assert sched.n_preemptions == 0 and len(sched.waiting) == 1 and sched.waiting[0].handle is hs[2]
    while (step := sched.schedule()) is not None or sched.waiting:
        if step is not None:
            _run(engine, step)
        sched.admit()
    assert all(h.final is not None for h in hs)


def _alone_with(engine: Engine, prompt: list[int], n: int, sampling: SamplingParams) -> list[int]:
    """The tokens of one request with nothing else scheduled."""
    sched = engine.scheduler
    h = RequestHandle()
    sched.add(
        Generate(GenerationRequest(prompt=prompt, max_tokens=n, sampling=sampling, cache_prompt=False), h)
    )
    sched.admit()
    while (step := sched.schedule()) is not None:
        _run(engine, step)
    assert h.final is not None and h.final.reason == StopReason.LENGTH
    return handle_tokens(h)
