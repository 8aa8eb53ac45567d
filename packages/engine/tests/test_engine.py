"""The engine loop, scheduler and LLM API on a tiny random llama model (fast, no real weights)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from tiny_models import write_tiny_model

from llama_engine import (
    LLM,
    Engine,
    EngineConfig,
    GenerationRequest,
    QueueFullError,
    SamplingParams,
    StopReason,
)
from llama_engine.requests import FinalEvent, TokenEvent
from llama_engine.scheduler import _split_stop

GREEDY = SamplingParams(temperature=0.0)


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
