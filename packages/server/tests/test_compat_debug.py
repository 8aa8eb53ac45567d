"""llama-server's debugging surfaces against a real server: `__verbose` (`-v`, or a request's `verbose`) on
OpenAI-compatible results, `return_progress` prompt-progress events on every streaming API, post-sampling
probabilities; and flags with llama.cpp's defaults: `--pooling` (the model's own) and `-sp/--special`."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import Server, smollm2_path, start_server, stop_server

from llama_engine import Pooling
from llama_server.cli import build_config, main
from llama_server.model_overrides import open_with_overrides
from llama_server.pooling import model_pooling

N_BATCH = 64
CHAT = {
    "messages": [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
}


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """`-v` (every OAI result carries `__verbose`), one slot, prompts evaluated 64 tokens per step,
    embeddings without `--pooling` (SmolLM2 has no pooling type: none), `-sp`."""
    s: Server = start_server(
        tmp_path_factory.mktemp("debug"),
        *("-v", "-c", "512", "-np", "1", "-b", str(N_BATCH), "--temp", "0", "--embeddings", "-sp"),
    )
    with s.client() as client:
        yield client
    stop_server(s)


def _events(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text[:300]
    return [json.loads(line[6:]) for line in r.text.split("\n") if line.startswith("data: {")]


def test_verbose_level_above_nine_turns_it_on():
    def cfg(*args: str) -> Any:
        return build_config(main.make_context("llama-server", ["-m", str(smollm2_path()), *args]).params)

    assert cfg("-v").verbose and cfg("-lv", "10").verbose
    assert not cfg().verbose and not cfg("-lv", "9").verbose


def test_verbose_chat_carries_the_native_result(c):
    r = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    body = r.json()
    v = body["__verbose"]
    assert "Book" in v["prompt"] and v["prompt"].startswith("<|im_start|>system\nBook")
    assert v["content"] == body["choices"][0]["message"]["content"] and v["stop"] is True
    assert v["tokens_predicted"] == 3 and v["generation_settings"]["n_predict"] == 3
    assert v["stop_type"] == "limit" and "timings" in v
    off = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2, "verbose": False}).json()
    assert "__verbose" not in off


def test_verbose_chat_stream_on_the_first_final_chunk(c):
    r = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3, "stream": True})
    chunks = _events(r)
    marked = [i for i, ch in enumerate(chunks) if "__verbose" in ch]
    assert len(marked) == 1
    v = chunks[marked[0]]["__verbose"]
    assert v["content"] == "" and v["tokens"] == [] and v["tokens_predicted"] == 3  # streamed already
    assert v["generation_settings"]["stream"] is True
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_verbose_completions_stream_and_body(c):
    body = {"prompt": "The capital of France is", "max_tokens": 3}
    full = c.post("/v1/completions", json=body).json()
    assert full["__verbose"]["content"] == full["choices"][0]["text"]
    chunks = _events(c.post("/v1/completions", json={**body, "stream": True}))
    assert all("__verbose" in ch for ch in chunks)
    partial = [ch["__verbose"] for ch in chunks[:-1]]
    assert [p["tokens_predicted"] for p in partial] == list(range(1, len(partial) + 1))
    assert all(p["stop"] is False and p["id_slot"] == -1 for p in partial)
    assert "".join(p["content"] for p in partial) == full["choices"][0]["text"]
    assert chunks[-1]["__verbose"]["stop"] is True
    # the native route has no __verbose: it is the native result
    assert "__verbose" not in c.post("/completion", json={"prompt": "Hi", "n_predict": 1}).json()


def _progress(chunks: list[dict[str, Any]]) -> list[dict[str, int]]:
    return [ch["prompt_progress"] for ch in chunks if "prompt_progress" in ch]


def _check_progress(steps: list[dict[str, int]], cached: bool) -> None:
    first, last = steps[0], steps[-1]
    assert first["total"] > 0 and first["cache"] == first["processed"]
    assert (first["cache"] > 0) == cached
    for a, b in itertools.pairwise(steps):
        assert (b["total"], b["cache"]) == (a["total"], a["cache"]) and b["processed"] > a["processed"]
    assert last["processed"] == last["total"]
    assert len(steps) == 1 + math.ceil((first["total"] - first["cache"]) / N_BATCH)


def test_return_progress_on_chat_per_prompt_batch(c):
    body = {
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "This is a test" * 30}],
        "stream": True,
        "return_progress": True,
    }
    chunks = _events(c.post("/v1/chat/completions", json=body))
    steps = _progress(chunks)
    _check_progress(steps, cached=False)
    assert len(steps) >= 3  # the prompt took more than one batch
    for ch in chunks:
        if "prompt_progress" in ch:
            assert ch["choices"][0]["delta"] == {"role": "assistant", "content": None}
    again = _progress(_events(c.post("/v1/chat/completions", json=body)))
    _check_progress(again, cached=True)
    assert len(again) == 2  # all but the last prompt token came from the cache
    plain = _events(c.post("/v1/chat/completions", json={**body, "return_progress": False}))
    assert not _progress(plain)


def test_return_progress_native_with_timings(c):
    body = {
        "prompt": "the quick brown fox jumps over the lazy dog " * 20,
        "n_predict": 2,
        "stream": True,
        "timings_per_token": True,
        "return_progress": True,
        "cache_prompt": False,
    }
    chunks = _events(c.post("/completion", json=body))
    prog = [ch for ch in chunks if "prompt_progress" in ch]
    _check_progress([ch["prompt_progress"] for ch in prog], cached=False)
    first = prog[0]["timings"]
    assert first["prompt_n"] == 0 and first["prompt_ms"] == 0.0 and first["predicted_n"] == 0
    ms = 0.0
    for ch in prog:
        # llama-server's progress update is an empty token output: token id 0, no text
        assert ch["content"] == "" and ch["stop"] is False and ch["tokens"] == [0]
        t = ch["timings"]
        assert all(v is not None and v >= 0 for v in t.values()) and t["prompt_ms"] >= ms
        assert t["prompt_n"] == ch["prompt_progress"]["processed"] - ch["prompt_progress"]["cache"]
        ms = t["prompt_ms"]
    assert ms > 0
    # not streamed: no progress, the usual body
    assert "prompt_progress" not in c.post("/completion", json={**body, "stream": False}).json()


def test_return_progress_on_completions_and_responses(c):
    prompt = "This is a test" * 30
    body = {"prompt": prompt, "max_tokens": 2, "stream": True, "return_progress": True, "cache_prompt": False}
    chunks = _events(c.post("/v1/completions", json=body))
    _check_progress(_progress(chunks), cached=False)
    assert all(ch["choices"][0]["text"] == "" for ch in chunks if "prompt_progress" in ch)
    resp = {"input": prompt, "max_output_tokens": 4, "stream": True, "return_progress": True}
    events = _events(c.post("/v1/responses", json={**resp, "timings_per_token": True}))
    prog = [e for e in events if "prompt_progress" in e]
    assert prog and all(e["type"] == "response.in_progress" for e in prog)
    assert prog[-1]["prompt_progress"]["processed"] == prog[-1]["prompt_progress"]["total"]
    # llama-server's telemetry: timings on the last event of each token, and on response.completed
    assert any(e["type"] == "response.output_text.delta" and "timings" in e for e in events)
    done = events[-1]
    assert done["type"] == "response.completed" and "usage" in done["response"]
    assert done["timings"]["predicted_n"] == 4 and done["timings"]["prompt_per_second"] >= 0
    plain = _events(c.post("/v1/responses", json={**resp, "return_progress": False}))
    assert not any("timings" in e for e in plain[:-1]) and "timings" in plain[-1]


def _check_post_probs(entries: list[dict[str, Any]], n_probs: int) -> None:
    for tok in entries:
        assert tok["id"] >= 0 and isinstance(tok["token"], str) and isinstance(tok["bytes"], list)
        assert 0.0 < tok["prob"] <= 1.0 and "logprob" not in tok
        tops = tok["top_probs"]
        assert 0 < len(tops) <= n_probs and all(0.0 < p["prob"] <= 1.0 for p in tops)
        assert [p["prob"] for p in tops] == sorted((p["prob"] for p in tops), reverse=True)
        if len(tops) < n_probs:  # fewer only when the candidates left after the chain sum to 1
            assert sum(p["prob"] for p in tops) == pytest.approx(1.0)


def test_post_sampling_probs_native_and_backend_sampling(c):
    body = {
        "prompt": "Today was the day. Today I would finally become a",
        "n_probs": 10,
        "temperature": 1.0,
        "n_predict": 5,
        "seed": 4242,
        "post_sampling_probs": True,
    }
    res = c.post("/completion", json=body).json()
    probs = res["completion_probabilities"]
    assert len(probs) == 5 and len(probs[0]["top_probs"]) == 10
    _check_post_probs(probs, 10)
    assert res["generation_settings"]["post_sampling_probs"] is True
    # the sampler chain runs on the CPU either way: backend_sampling gives the same probabilities
    same = c.post("/completion", json={**body, "backend_sampling": True}).json()
    assert same["completion_probabilities"] == probs
    # a narrow chain (top_k 3) leaves 3 candidates whose probabilities sum to 1
    narrow = c.post("/completion", json={**body, "top_k": 3}).json()["completion_probabilities"]
    _check_post_probs(narrow, 10)
    assert all(len(t["top_probs"]) <= 3 for t in narrow)


def test_post_sampling_probs_on_chat_logprobs(c):
    body = {**CHAT, "max_tokens": 3, "logprobs": True, "top_logprobs": 5, "post_sampling_probs": True}
    choice = c.post("/v1/chat/completions", json={**body, "temperature": 0.8, "seed": 1}).json()["choices"][0]
    _check_post_probs(choice["logprobs"]["content"], 5)
    chunks = _events(c.post("/v1/chat/completions", json={**body, "stream": True}))
    streamed = [
        e for ch in chunks for ch_c in ch["choices"] for e in (ch_c.get("logprobs") or {}).get("content", [])
    ]
    assert len(streamed) == 3
    _check_post_probs(streamed, 5)
    pre = c.post("/v1/chat/completions", json={**body, "post_sampling_probs": False}).json()
    entry = pre["choices"][0]["logprobs"]["content"][0]
    assert "logprob" in entry and len(entry["top_logprobs"]) == 5


def test_pooling_defaults_to_the_models_own(c):
    r = c.post("/v1/embeddings", json={"input": "hello"})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "Pooling type 'none' is not OAI compatible. Please use a different pooling type"
    )
    n = len(c.post("/tokenize", json={"content": "hello world", "add_special": True}).json()["tokens"])
    rows = c.post("/embedding", json={"content": "hello world"}).json()[0]["embedding"]
    assert len(rows) == n and all(len(v) == 576 for v in rows)  # one unnormalised vector per token
    path = str(smollm2_path())
    for value, want in ((1, Pooling.MEAN), (2, Pooling.CLS), (3, Pooling.LAST), (4, Pooling.RANK)):
        gguf = open_with_overrides(path, (("llama.pooling_type", value),), None)
        assert model_pooling(gguf.metadata, "llama") == want
    assert model_pooling({}, "llama") == Pooling.NONE


def test_special_tokens_are_rendered(c):
    tok = c.post("/tokenize", json={"content": "<|im_start|><|im_end|>", "parse_special": True}).json()
    start, end = tok["tokens"]
    body = {"prompt": "Hi", "n_predict": 1, "logit_bias": [[start, 100.0]]}
    assert c.post("/completion", json=body).json()["content"] == "<|im_start|>"
    eos = c.post("/completion", json={**body, "logit_bias": [[end, 100.0]]}).json()
    assert eos["content"] == "<|im_end|>" and eos["stop_type"] == "eos"
    chunks = _events(c.post("/completion", json={**body, "stream": True}))
    assert "".join(ch["content"] for ch in chunks) == "<|im_start|>"
    # the end-of-generation token's own chunk carries its piece; probabilities show special pieces too
    end_bias = {**body, "logit_bias": [[end, 100.0]], "n_probs": 1}
    chunks = _events(c.post("/completion", json={**end_bias, "stream": True}))
    assert chunks[0]["content"] == "<|im_end|>" and chunks[0]["tokens"] == [end] and chunks[-1]["stop"]
    assert chunks[0]["completion_probabilities"][0]["token"] == "<|im_end|>"
