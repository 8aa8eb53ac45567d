"""POST /completion (native), /v1/completions (OpenAI legacy, with the openai SDK) and /infill."""

from __future__ import annotations

import json

import openai
import pytest
from conftest import assert_error, sse_events

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_native_non_stream(client):
    r = client.post("/completion", json={"prompt": PROMPT, "n_predict": 4, "return_tokens": True})
    assert r.status_code == 200
    body = r.json()
    assert body["content"].startswith(" Paris")
    assert body["stop"] is True and body["stop_type"] == "limit" and body["tokens_predicted"] == 4
    assert len(body["tokens"]) == 4 and body["tokens_evaluated"] == 5
    assert body["model"] == "smol" and body["prompt"] == PROMPT
    t = body["timings"]
    assert t["predicted_n"] == 4 and t["cache_n"] + t["prompt_n"] == 5
    assert body["generation_settings"]["n_predict"] == 4
    assert list(body)[:4] == ["index", "content", "tokens", "id_slot"]


def test_native_stream(client):
    r = client.post("/completions", json={"prompt": PROMPT, "n_predict": 3, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-accel-buffering"] == "no"
    events = [json.loads(e) for e in sse_events(r.text)]
    assert "[DONE]" not in r.text
    assert [e["stop"] for e in events] == [False, False, False, True]
    assert "".join(e["content"] for e in events).startswith(" Paris")
    assert events[-1]["content"] == "" and events[-1]["tokens"] == [] and events[-1]["id_slot"] >= 0
    assert all(e["id_slot"] == -1 for e in events[:-1])


def test_token_prompt_and_probs(client):
    ids = client.post("/tokenize", json={"content": PROMPT}).json()["tokens"]
    body = client.post("/completion", json={"prompt": ids, "n_predict": 2, "n_probs": 3}).json()
    assert body["content"].startswith(" Paris")
    probs = body["completion_probabilities"]
    assert len(probs) == 2 and len(probs[0]["top_logprobs"]) == 3
    assert probs[0]["token"] == " Paris" and probs[0]["logprob"] <= 0
    post = client.post(
        "/completion", json={"prompt": ids, "n_predict": 1, "n_probs": 2, "post_sampling_probs": True}
    ).json()
    assert 0 < post["completion_probabilities"][0]["prob"] <= 1


def test_several_prompts(client):
    body = client.post("/completion", json={"prompt": [PROMPT, "Hello"], "n_predict": 2}).json()
    assert isinstance(body, list) and [b["index"] for b in body] == [0, 1]
    assert body[0]["content"].startswith(" Paris")


def test_stop_string(client):
    body = client.post("/completion", json={"prompt": PROMPT, "n_predict": 8, "stop": ["."]}).json()
    assert body["stop_type"] == "word" and body["stopping_word"] == "." and body["content"] == " Paris"


def test_id_slot_and_cache(client):
    a = client.post("/completion", json={"prompt": PROMPT, "n_predict": 1, "id_slot": 2}).json()
    assert a["id_slot"] == 2
    b = client.post(
        "/completion", json={"prompt": PROMPT, "n_predict": 1, "id_slot": 6}
    ).json()  # wraps: 6 % 4
    assert b["id_slot"] == 2 and b["timings"]["cache_n"] == 4
    c = client.post(
        "/completion", json={"prompt": PROMPT, "n_predict": 1, "id_slot": 2, "cache_prompt": False}
    ).json()
    assert c["timings"]["cache_n"] == 0


def test_response_fields(client):
    body = client.post(
        "/completion",
        json={
            "prompt": PROMPT,
            "n_predict": 1,
            "response_fields": ["content", "generation_settings/n_predict"],
        },
    ).json()
    assert (
        set(body) == {"content", "generation_settings/n_predict"}
        and body["generation_settings/n_predict"] == 1
    )


def test_context_exceeded(client):
    err = assert_error(
        client.post("/completion", json={"prompt": [1] * 2100, "n_predict": 1}),
        400,
        "exceed_context_size_error",
    )
    assert err["n_prompt_tokens"] == 2100 and err["n_ctx"] == 2048
    # a stream whose first result is an error is a plain JSON error, not an SSE stream
    assert_error(client.post("/completion", json={"prompt": [1] * 2100, "stream": True}), 400)


def test_infill_needs_fim_tokens(client):
    assert_error(
        client.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")"}),
        501,
        "not_supported_error",
    )


def test_openai_completions(oai):
    r = oai.completions.create(model="x", prompt=PROMPT, max_tokens=3, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text.startswith(" Paris")
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    assert r.system_fingerprint.startswith("b") and r.id.startswith("chatcmpl-") and r.model == "smol"


def test_openai_completions_stream(oai):
    chunks = list(oai.completions.create(model="x", prompt=PROMPT, max_tokens=3, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks).startswith(" Paris")
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 3


def test_openai_completions_raw_done(client):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "stream": True})
    assert r.text.endswith("data: [DONE]\n\n")


def test_ignore_eos_shows_null_biases(client):
    body = client.post("/completion", json={"prompt": "Hi", "n_predict": 1, "ignore_eos": True}).json()
    bias = body["generation_settings"]["logit_bias"]
    assert bias and all(b["bias"] is None for b in bias) and 2 in {b["token"] for b in bias}


def test_n_predict_zero_evaluates_the_prompt_only(client):
    body = client.post("/completion", json={"prompt": PROMPT, "n_predict": 0}).json()
    assert body["content"] == "" and body["tokens_predicted"] == 0 and body["tokens_evaluated"] == 5
    assert body["stop_type"] == "limit" and body["timings"]["predicted_n"] == 0
