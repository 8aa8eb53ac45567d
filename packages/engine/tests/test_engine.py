"""The engine loop, scheduler and LLM API on a tiny random llama model (fast, no real weights)."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from tiny_models import write_tiny_model

from llama_engine import (
    LLM,
    EmbeddingRequest,
    Engine,
    EngineConfig,
    GenerationRequest,
    QueueFullError,
    RequestCancelledError,
    RequestHandle,
    SamplingParams,
    StopReason,
)
from llama_engine import scheduler as scheduler_module
from llama_engine.batch import Batch
from llama_engine.requests import FinalEvent, TokenEvent
from llama_engine.scheduler import _split_stop
from llama_engine.vocab_tables import build_dry_vocab
from llama_quant.cpu import KernelSet

GREEDY = SamplingParams(temperature=0.0)
GREEDY_NO_EOS = SamplingParams(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", "llama", seed=7)


@pytest.fixture(scope="module")
def llm(tiny_path: Path):
    with LLM(tiny_path, n_ctx=256, n_parallel=4, n_batch=64) as m:
        yield m


def _run(engine: Engine, req: GenerationRequest) -> tuple[list[int], FinalEvent]:
    tokens, final = [], None
    for ev in engine.submit(req):
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token)
        else:
            final = ev
    assert final is not None
    return tokens, final


def test_greedy_is_deterministic_and_counts_usage(llm: LLM) -> None:
    req = GenerationRequest(
        prompt=[256, 10, 20, 30], max_tokens=12, sampling=SamplingParams(temperature=0.0, ignore_eos=True)
    )
    a, fa = _run(llm.engine, req)
    b, fb = _run(llm.engine, req)
    assert a == b and len(a) == 12
    assert fa.reason == StopReason.LENGTH and fa.usage.prompt_tokens == 4 and fa.usage.completion_tokens == 12
    assert fb.usage.cached_tokens == 3  # the second run reused the cached prompt (all but the last token)


def test_seeded_sampling_repeats(llm: LLM) -> None:
    p = SamplingParams(temperature=1.0, seed=1234, top_k=0, top_p=1.0, min_p=0.0, ignore_eos=True)
    req = GenerationRequest(prompt=[256, 1, 2, 3], max_tokens=16, sampling=p)
    assert _run(llm.engine, req)[0] == _run(llm.engine, req)[0]


def test_batch_invariance_greedy(llm: LLM) -> None:
    """A greedy request yields the same tokens alone or alongside other requests."""
    prompts = [[256, *range(40, 40 + n)] for n in (3, 9, 17, 30)]
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    alone = [
        _run(llm.engine, GenerationRequest(prompt=p, max_tokens=10, sampling=params, cache_prompt=False))[0]
        for p in prompts
    ]
    results: list[list[int]] = [[] for _ in prompts]
    handles = [
        llm.engine.submit(GenerationRequest(prompt=p, max_tokens=10, sampling=params, cache_prompt=False))
        for p in prompts
    ]

    def drain(i: int) -> None:
        results[i] = [ev.token for ev in handles[i] if isinstance(ev, TokenEvent)]

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == alone


def test_prefix_is_borrowed_from_another_slot(llm: LLM) -> None:
    shared = [256, *range(100, 130)]
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    _run(llm.engine, GenerationRequest(prompt=[*shared, 1, 2], max_tokens=1, sampling=params, slot=0))
    _, final = _run(
        llm.engine, GenerationRequest(prompt=[*shared, 3, 4], max_tokens=1, sampling=params, slot=1)
    )
    assert final.usage.cached_tokens == len(shared)
    assert final.timings.prompt_n == 2


def test_cancel_frees_the_slot(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    handle = llm.engine.submit(GenerationRequest(prompt=[256, 5], max_tokens=200, sampling=params))
    seen = 0
    for ev in handle:
        if isinstance(ev, TokenEvent):
            seen += 1
            if seen == 3:
                handle.cancel()
        else:
            assert ev.reason == StopReason.CANCELLED
    assert seen < 200
    assert all(s.state == 0 for s in llm.engine.scheduler.slots)


def test_bad_prompts_are_rejected(llm: LLM) -> None:
    with pytest.raises(ValueError, match="empty"):
        llm.engine.submit(GenerationRequest(prompt=[]))
    with pytest.raises(ValueError, match=r"0\.\.258"):
        llm.engine.submit(GenerationRequest(prompt=[1, 100000]))
    with pytest.raises(ValueError, match="context"):
        llm.engine.submit(GenerationRequest(prompt=[1] * 300))


def test_queue_bound(tiny_path: Path) -> None:
    engine = Engine(
        tiny_path, EngineConfig(n_ctx=64, n_parallel=1, max_queue=2, warmup=False)
    )  # loop not started
    req = GenerationRequest(prompt=[256, 1], max_tokens=1)
    for _ in range(3):  # one for the slot, two waiting (still in the inbox: they count)
        engine.submit(req)
    with pytest.raises(QueueFullError):
        engine.submit(req)


def test_embeddings_are_normalized(llm: LLM) -> None:
    v = llm.embed([256, 1, 2, 3])
    assert v.shape == (64,) and abs(float(np.linalg.norm(v)) - 1.0) < 1e-5
    per_token = llm.embed([256, 1, 2], pooling="none")
    assert per_token.shape == (3, 64)


@pytest.mark.parametrize(
    ("text", "stops", "expected"),
    [
        ("hello wor", ["world"], ("hello ", "wor", "")),
        ("hello world!", ["world"], ("hello ", "", "world")),
        ("abc", ["x"], ("abc", "", "")),
        ("a\n\n", ["\n\n\n"], ("a", "\n\n", "")),
        ("", ["x"], ("", "", "")),
    ],
)
def test_stop_strings_are_held_back(text: str, stops: list[str], expected: tuple[str, str, str]) -> None:
    assert _split_stop(text, stops) == expected


def test_a_long_embedding_does_not_stall_a_stream(tiny_path: Path) -> None:
    """The embedding runs in chunks under the step budget; the stream gets a token every step between."""
    engine = Engine(tiny_path, EngineConfig(n_ctx=512, n_parallel=2, n_batch=16, warmup=False))
    embd_prompt = [256, *range(1, 200)]
    progress: list[int] = []  # per stream event: embedding tokens evaluated so far (-1: no embedding)
    finished = threading.Event()

    def on_event(ev: TokenEvent | FinalEvent) -> None:  # the engine thread, between steps
        jobs = engine.scheduler.embeddings
        progress.append(jobs[0].n_done if jobs else -1)
        if isinstance(ev, FinalEvent):
            finished.set()

    # both queued before the loop starts, so the steps are the same on any machine
    stream = engine.submit(
        GenerationRequest(prompt=[256, 9, 8], max_tokens=40, sampling=GREEDY_NO_EOS), on_event
    )
    embedding = engine.submit_embedding(EmbeddingRequest(prompt=embd_prompt))
    engine.start()
    try:
        vector = embedding.result()
        assert finished.wait(60)
        alone = engine.embed(EmbeddingRequest(prompt=embd_prompt))  # with nothing beside it
    finally:
        engine.shutdown()
    assert stream.final is not None and stream.final.reason == StopReason.LENGTH
    during = sorted(set(p for p in progress if p >= 0))
    # 200 tokens in chunks of at most 15 (16 less the stream's token): the stream had a token every chunk
    assert len(during) >= 200 // 15 and during[0] == 0
    assert all(0 < b - a <= 15 for a, b in itertools.pairwise(during))
    # the stream's 3-token prompt ran in a step of its own (a short prompt is not held behind a long one),
    # so its first two tokens both saw the embedding at 0
    assert progress[:2] == [0, 0] and progress[len(during) + 1] == -1
    assert len(progress) == 41  # 40 tokens and the final event
    assert np.array_equal(vector, alone)  # chunked beside a stream, the same numbers


def test_typed_cancel_before_the_loop_runs(tiny_path: Path) -> None:
    engine = Engine(tiny_path, EngineConfig(n_ctx=256, n_parallel=1, warmup=False))
    handle = engine.submit(GenerationRequest(prompt=[256, 1, 2], max_tokens=50, sampling=GREEDY_NO_EOS))
    embedding = engine.submit_embedding(EmbeddingRequest(prompt=[256, *range(1, 100)]))
    handle.cancel()
    embedding.cancel()
    assert isinstance(handle.cancelled, threading.Event) and handle.cancelled.is_set()
    engine.start()
    try:
        events = list(handle)
        assert len(events) == 1 and isinstance(events[0], FinalEvent)
        assert events[0].reason == StopReason.CANCELLED
        with pytest.raises(RequestCancelledError):
            embedding.result()
    finally:
        engine.shutdown()


def test_shutdown_ends_open_requests(tiny_path: Path) -> None:
    engine = Engine(tiny_path, EngineConfig(n_ctx=256, n_parallel=1, warmup=False)).start()
    handle = engine.submit(GenerationRequest(prompt=[256, 1], max_tokens=-1, sampling=GREEDY_NO_EOS))
    next(iter(handle))  # generating
    engine.shutdown()
    assert handle.final is not None and handle.final.reason == StopReason.ERROR


def test_dry_table_is_built_off_the_engine_thread(tiny_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DRY request waits for its table in the queue; a plain one submitted with it runs meanwhile."""
    built_on: list[str] = []

    def recording_build(tok):  # the real build, noting which thread runs it
        built_on.append(threading.current_thread().name)
        return build_dry_vocab(tok)

    monkeypatch.setattr(scheduler_module, "build_dry_vocab", recording_build)
    dry = SamplingParams(temperature=0.0, ignore_eos=True, dry_multiplier=0.8)
    with LLM(tiny_path, n_ctx=256, n_parallel=2, warmup=False) as m:
        engine = m.engine
        table: Future = Future()  # a table still being built
        engine.scheduler.set_dry_vocab(table)
        h_dry = engine.submit(GenerationRequest(prompt=[256, 3, 3, 3], max_tokens=4, sampling=dry))
        h_plain = engine.submit(GenerationRequest(prompt=[256, 4], max_tokens=4, sampling=GREEDY_NO_EOS))
        plain = list(h_plain)
        assert len(plain) == 5 and isinstance(plain[-1], FinalEvent)
        assert h_dry.final is None and h_dry._events.empty() and engine.n_waiting == 1
        table.set_result(build_dry_vocab(engine.tokenizer))
        dry_events = list(h_dry)
        assert dry_events[-1].reason == StopReason.LENGTH and len(dry_events) == 5

        engine.scheduler._dry_vocab = None  # the default path: the first DRY request starts the build
        again = list(engine.submit(GenerationRequest(prompt=[256, 3, 3, 3], max_tokens=4, sampling=dry)))
        assert [ev.token for ev in again[:-1]] == [ev.token for ev in dry_events[:-1]]
    assert built_on and "llama-engine" not in built_on


def test_kernel_set_is_chosen_in_the_config(tiny_path: Path, llm: LLM) -> None:
    with pytest.raises(ValueError):
        Engine(tiny_path, EngineConfig(n_ctx=64, warmup=False, kernels="no-such-kernels"))
    req = GenerationRequest(
        prompt=[256, 10, 20, 30], max_tokens=6, sampling=GREEDY_NO_EOS, cache_prompt=False
    )
    with LLM(tiny_path, n_ctx=64, warmup=False, kernels="portable") as portable:
        assert portable.engine.kernels == KernelSet.PORTABLE
        assert _run(portable.engine, req)[0] == _run(llm.engine, req)[0]  # every kernel set: the same numbers


def test_float_weights_run_fast_unless_exact_is_asked(tmp_path: Path) -> None:
    """An F16 model: the fast kernels (f32 sums) by default, the exact ones (the portable build's bits)
    with `exact_floats`; their logits differ by f32 rounding only and their greedy tokens agree."""
    path = write_tiny_model(tmp_path / "f16.gguf", "llama", seed=7, qtype=GGMLQuantizationType.F16)
    prompt = [256, *range(3, 40)]
    logits = {}
    for exact in (False, True):
        engine = Engine(path, EngineConfig(n_ctx=128, warmup=False, exact_floats=exact))
        assert engine.model.exact_floats is exact and engine.model.output.exact is exact
        out, _ = engine.model.forward(Batch.single(prompt, all_logits=True), engine.kv)
        logits[exact] = out.copy()
        assert _tokens_alone(engine, prompt) == _tokens_alone(engine, prompt)
    fast, exact_ = logits[False], logits[True]
    assert not np.array_equal(fast, exact_)
    # a random model amplifies rounding differences along the sequence: tight at first, looser later
    scale = np.abs(exact_).max()
    assert np.abs(fast[:4] - exact_[:4]).max() <= 1e-5 * scale
    assert np.abs(fast - exact_).max() <= 1e-2 * scale
    top = np.sort(exact_, axis=1)
    clear = top[:, -1] - top[:, -2] > 0.05 * scale  # rows without a near-tie for the top token
    assert np.array_equal(fast.argmax(axis=1)[clear], exact_.argmax(axis=1)[clear]) and clear.sum() > 20


def test_a_failed_warm_up_is_raised_to_whoever_waits(tmp_path: Path) -> None:
    class _FailingWarmUp(Engine):
        def warmup(self) -> None:
            raise MemoryError("no room to compile")

    path = write_tiny_model(tmp_path / "llama.gguf", "llama", seed=5)
    engine = _FailingWarmUp(path, EngineConfig(n_ctx=256)).start()
    with pytest.raises(RuntimeError, match="failed to start: no room to compile"):
        engine.wait_ready(timeout=60)
    assert isinstance(engine.failed, MemoryError)
    engine.shutdown()


def _submit(engine: Engine, prompt: list[int]) -> RequestHandle:
    return engine.submit(
        GenerationRequest(prompt=prompt, max_tokens=4, sampling=GREEDY_NO_EOS, cache_prompt=False)
    )


def _admit(engine: Engine) -> None:
    engine._drain(block=False)
    engine.scheduler.admit()


def test_a_new_request_interrupts_a_prompt_step(tiny_path: Path) -> None:
    """A prompt step stopped between layers for a newly arrived request is held with its cells placed:
    the newcomer's prompt runs first, then the held step goes on from the layer it stopped at, and both
    requests give the tokens they give alone."""
    prompt, short = [256, *range(1, 100)], [256, 7, 8, 9]
    engine = Engine(tiny_path, EngineConfig(n_ctx=512, n_parallel=2, n_batch=32, warmup=False))
    want, want_short = _tokens_alone(engine, prompt), _tokens_alone(engine, short)
    handle = _submit(engine, prompt)
    _admit(engine)
    slot = next(s for s in engine.scheduler.slots if s.request is not None)
    newcomer = _submit(engine, short)  # arrives while the first prompt step runs
    engine.step()
    assert engine.n_interrupted == 1 and slot.tokens == [] and engine.kv.seq_pos_max(slot.id) == 31
    _admit(engine)
    other = next(s for s in engine.scheduler.slots if s.request is not None and s is not slot)
    engine.step()  # the newcomer's prompt, alone: its first token
    assert other.n_generated == 1 and slot.tokens == []
    engine.step()  # the held step, from where it stopped
    assert len(slot.tokens) == 32 and engine.n_interrupted == 1
    while engine.scheduler.has_work:
        engine.step()
    assert handle.final is not None and [ev.token for ev in _events(handle)] == want
    assert newcomer.final is not None and [ev.token for ev in _events(newcomer)] == want_short


def test_a_request_that_ends_while_its_step_is_held_leaves_no_cells(tiny_path: Path) -> None:
    """Cancelled while its step is held: the step's placed cells are dropped with it (the slot's cache is
    what ran whole), and the slot's next request gives the tokens it gives alone."""
    prompt = [256, *range(1, 100)]
    engine = Engine(tiny_path, EngineConfig(n_ctx=512, n_parallel=2, n_batch=32, warmup=False))
    want = _tokens_alone(engine, prompt)
    handle = _submit(engine, prompt)
    _admit(engine)
    slot = next(s for s in engine.scheduler.slots if s.request is not None)
    engine.step()  # 32 tokens run whole
    newcomer = _submit(engine, [256, 5, 6])
    engine.step()  # the next chunk is stopped for the newcomer
    assert engine.n_interrupted == 1 and engine.kv.seq_pos_max(slot.id) == 63 and len(slot.tokens) == 32
    handle.cancel()
    _admit(engine)
    engine.step()  # the cancellation is seen, the newcomer's prompt runs
    assert handle.final is not None and engine.kv.seq_pos_max(slot.id) == 31
    while engine.scheduler.has_work:
        engine.step()
    assert engine.scheduler.suspended == {} and not engine.kv.pinned
    assert newcomer.final is not None and _tokens_alone(engine, prompt) == want


@pytest.mark.parametrize("arch", ["gemma3", "gemma4", "gpt-oss", "qwen3moe"])
def test_a_step_held_at_any_layer_resumes_exactly(tmp_path: Path, arch: str) -> None:
    """Sliding windows, per-layer inputs and shared keys (gemma4), sinks and experts: a prompt step held
    before some layer while a newcomer's prompt runs, then resumed, gives both requests the tokens they
    give alone."""
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, seed=3)
    prompt, short = [1, *range(5, 60)], [1, 9, 8, 7]
    engine = Engine(path, EngineConfig(n_ctx=256, n_parallel=2, n_batch=32, warmup=False))
    want, want_short = _tokens_alone(engine, prompt), _tokens_alone(engine, short)
    handle = _submit(engine, prompt)
    _admit(engine)
    newcomer = _submit(engine, short)
    calls = itertools.count(1)
    stop_at = engine.model.config.n_layer - 1  # asked before layers 1..n-1: held before the last one
    engine._arrived = lambda: next(calls) == stop_at  # type: ignore[method-assign]
    engine.step()
    assert engine.n_interrupted == 1 and engine._held is not None and engine._held.suspension.layer == stop_at
    _admit(engine)
    while engine.scheduler.has_work:
        engine.step()
    assert engine.n_interrupted == 1
    assert handle.final is not None and [ev.token for ev in _events(handle)] == want
    assert newcomer.final is not None and [ev.token for ev in _events(newcomer)] == want_short


def _tokens_alone(engine: Engine, prompt: list[int]) -> list[int]:
    h = engine.submit(
        GenerationRequest(prompt=prompt, max_tokens=4, sampling=GREEDY_NO_EOS, cache_prompt=False)
    )
    engine._drain(block=False)
    engine.scheduler.admit()
    while engine.scheduler.has_work:
        engine.step()
    return [ev.token for ev in _events(h)]


def _events(handle: RequestHandle) -> list[TokenEvent]:
    out = []
    while not handle._events.empty():
        ev = handle._events.get()
        if isinstance(ev, TokenEvent):
            out.append(ev)
    return out
