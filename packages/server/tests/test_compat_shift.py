"""Context shift and the context's end as llama-server handles them (endpoints.md §3 Details 4-5):
`n_keep` (+1 for a BOS, capped at n_ctx - 4), `n_discard` (0: half of the rest, clamped), the tokens
dropped, `truncated: true` in the final result, and `n_discard` in generation_settings. A tiny byte-level
model (one token per byte, no BOS) keeps the counts exact and the servers fast."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import sse_events, start_server, stop_server

from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams, TokenEvent
from llama_engine.slot import shift_sizes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine" / "tests"))
from tiny_models import write_tiny_model

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
PROMPT = "Hi how are you"  # 14 byte tokens


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("shift") / "tiny.gguf", "llama")


@pytest.fixture(scope="module")
def shifting(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    tmp = tmp_path_factory.mktemp("shift-on")
    s = start_server(tmp, "-m", str(model), "-c", "128", "-np", "1", "--temp", "0", "--context-shift")
    with s.client() as c:
        yield c
    stop_server(s)


@pytest.fixture(scope="module")
def shifting2(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    tmp = tmp_path_factory.mktemp("shift-n2")
    args = ("-m", str(model), "-c", "256", "-np", "2", "--temp", "0", "--context-shift")
    s = start_server(tmp, *args)
    with s.client() as c:
        yield c
    stop_server(s)


@pytest.fixture(scope="module")
def fixed(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    s = start_server(tmp_path_factory.mktemp("shift-off"), "-m", str(model), "-c", "128", "-np", "1")
    with s.client() as c:
        yield c
    stop_server(s)


@pytest.mark.parametrize(
    ("n_keep", "n_discard", "bos", "n_past", "n_ctx", "expected"),
    [
        (0, 0, False, 127, 128, (0, 63)),  # half of the rest
        (0, 0, True, 127, 128, (1, 63)),  # the BOS is kept too
        (10, 20, False, 127, 128, (10, 20)),  # the request's n_discard
        (10, 500, False, 127, 128, (10, 116)),  # clamped to n_left - 1
        (500, 0, False, 127, 128, (124, 1)),  # n_keep capped at n_ctx - 4
        (126, 0, False, 127, 128, (124, 1)),
        (-1, 0, False, 127, 128, (1, 63)),  # -1: the whole prompt (one token here)
        (-1, 0, True, 127, 128, (2, 62)),
    ],
)
def test_shift_sizes_follow_llama_server(n_keep, n_discard, bos, n_past, n_ctx, expected) -> None:
    req = GenerationRequest(prompt=[1], n_keep=n_keep, n_discard=n_discard)
    assert shift_sizes(req, n_past, n_ctx, bos) == expected


def _expected_cache(
    prompt: list[int], generated: list[int], n_keep: int, n_discard: int, n_ctx: int
) -> list[int]:
    """What the slot holds after generating: every token but the last is fed back; before feeding one to a
    slot whose next token would fill it, n_discard tokens after n_keep are dropped."""
    cache = list(prompt)
    for tok in generated[:-1]:
        if len(cache) + 1 >= n_ctx:
            del cache[n_keep : n_keep + n_discard]
        cache.append(tok)
    return cache


def test_the_engine_drops_the_requested_tokens(model: Path) -> None:
    engine = Engine(model, EngineConfig(n_ctx=64, n_parallel=1, n_batch=32, warmup=False)).start()
    try:
        prompt = list(range(40, 60))
        req = GenerationRequest(
            prompt=prompt, max_tokens=120, sampling=GREEDY, context_shift=True, n_keep=5, n_discard=7
        )
        h = engine.submit(req)
        toks = [ev.token for ev in h if isinstance(ev, TokenEvent)]
        assert h.final is not None and h.final.truncated and len(toks) == 120
        assert engine.scheduler.slots[0].tokens == _expected_cache(prompt, toks, 5, 7, 64)
        h = engine.submit(
            GenerationRequest(prompt=prompt, max_tokens=10, sampling=GREEDY, context_shift=True)
        )
        assert len([ev for ev in h if isinstance(ev, TokenEvent)]) == 10
        assert h.final is not None and not h.final.truncated  # a new request starts untruncated
    finally:
        engine.shutdown()


def test_shifted_completion_is_truncated(shifting: httpx.Client) -> None:
    r = shifting.post(
        "/completion",
        json={"prompt": PROMPT, "n_predict": 150, "n_keep": 4, "n_discard": 9, "temperature": 0},
    )
    body = r.json()
    assert r.status_code == 200, r.text
    assert body["timings"]["prompt_n"] == 14 and body["timings"]["predicted_n"] == 150
    assert body["truncated"] is True and body["stop_type"] == "limit"
    assert body["generation_settings"]["n_keep"] == 4 and body["generation_settings"]["n_discard"] == 9


def test_short_completion_is_not_truncated(shifting: httpx.Client) -> None:
    body = shifting.post("/completion", json={"prompt": PROMPT, "n_predict": 8}).json()
    assert body["timings"]["predicted_n"] == 8 and body["truncated"] is False
    assert body["generation_settings"]["n_discard"] == 0


def test_stream_final_event_says_truncated(shifting: httpx.Client) -> None:
    r = shifting.post("/completion", json={"prompt": PROMPT, "n_predict": 130, "stream": True})
    last = json.loads(sse_events(r.text)[-1])
    assert last["stop"] is True and last["truncated"] is True and last["tokens_predicted"] == 130


@pytest.mark.parametrize(("n_predict", "n_out", "truncated"), [(64, 64, False), (-1, 114, True)])
def test_context_end_without_shift(fixed: httpx.Client, n_predict: int, n_out: int, truncated: bool) -> None:
    """llama.cpp stops when the next token would fill the slot: 14 prompt + 114 generated = 128."""
    body = fixed.post(
        "/completion", json={"prompt": PROMPT, "n_predict": n_predict, "ignore_eos": True}
    ).json()
    assert body["timings"]["predicted_n"] == n_out and body["truncated"] is truncated
    assert body["stop_type"] == "limit"


def test_stream_stops_at_the_context_end(fixed: httpx.Client) -> None:
    r = fixed.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 256, "stream": True, "ignore_eos": True}
    )
    chunks = [json.loads(e) for e in sse_events(r.text) if e != "[DONE]"]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert reasons[-1] == "length" and all(x is None for x in reasons[:-1])


def test_the_whole_prompt_is_kept_with_n_keep_minus_one(model: Path) -> None:
    engine = Engine(model, EngineConfig(n_ctx=64, n_parallel=1, n_batch=32, warmup=False)).start()
    try:
        prompt = list(range(40, 60))
        req = GenerationRequest(prompt=prompt, max_tokens=100, sampling=GREEDY, context_shift=True, n_keep=-1)
        h = engine.submit(req)
        toks = [ev.token for ev in h if isinstance(ev, TokenEvent)]
        assert h.final is not None and h.final.truncated and len(toks) == 100
        tokens = engine.scheduler.slots[0].tokens
        assert tokens[:20] == prompt  # the prompt survived every shift
        assert tokens == _expected_cache(prompt, toks, 20, (63 - 20) // 2, 64)
    finally:
        engine.shutdown()


def test_generation_settings_report_the_raw_n_keep(shifting: httpx.Client) -> None:
    body = shifting.post("/completion", json={"prompt": PROMPT, "n_predict": 150, "n_keep": -1}).json()
    assert body["generation_settings"]["n_keep"] == -1  # as llama-server: the request's value
    assert body["truncated"] is True and body["timings"]["predicted_n"] == 150


def test_several_choices_refuse_a_context_shift(shifting2: httpx.Client) -> None:
    """llama-server: the n_cmpl > 1 choices of one prompt share it, a shift is an error (500)."""
    body = {"prompt": PROMPT, "n_predict": 200, "n": 2, "ignore_eos": True}
    r = shifting2.post("/completion", json=body)
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["message"] == "context shift cannot be used for shared prompt"
    assert err["type"] == "server_error"
    # one choice shifts as usual; several choices that fit are fine
    one = shifting2.post("/completion", json={**body, "n": 1})
    assert one.status_code == 200 and one.json()["truncated"] is True
    two = shifting2.post("/completion", json={**body, "n_predict": 20})
    assert two.status_code == 200 and [c["truncated"] for c in two.json()] == [False, False]
    assert shifting2.get("/health").status_code == 200
