"""llama-server compatibility against a real server: header case, stream timings, routes of features that\nare off, embeddings and Anthropic inputs llama-server rejects or converts, Vertex AI prediction mode."""

from __future__ import annotations

from collections.abc import Iterator

import conftest
import httpx
import pytest
from conftest import Server, assert_error, sse_events, start_server, stop_server


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module, in Vertex AI mode (it listens on AIP_HTTP_PORT; other routes as usual)."""
    port = conftest.free_port()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIP_MODE", "PREDICTION")
        mp.setenv("AIP_HTTP_PORT", str(port))
        mp.setenv("AIP_HEALTH_ROUTE", "vertex-health")
        mp.setattr(conftest, "free_port", lambda: port)
        s = start_server(
            tmp_path_factory.mktemp("compat"),
            "-c",
            "1024",
            "-np",
            "2",
            "--temp",
            "0",
            "--metrics",
            "--embeddings",
            "--pooling",
            "mean",
        )
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def c(srv: Server) -> Iterator[httpx.Client]:
    with srv.client() as client:
        yield client


def _raw_names(r: httpx.Response) -> list[str]:
    return [k.decode() for k, _ in r.headers.raw]


def test_header_names_in_canonical_case(c):
    r = c.options("/v1/models", headers={"Origin": "http://localhost:3000"})
    names = _raw_names(r)
    for name in (
        "Access-Control-Allow-Origin",
        "Access-Control-Allow-Credentials",
        "Access-Control-Allow-Methods",
        "Access-Control-Allow-Headers",
        "Content-Type",
        "Server",
    ):
        assert name in names, names
    r = c.get("/metrics")
    assert "Process-Start-Time-Unix" in _raw_names(r)
    r = c.post("/completion", json={"prompt": "Hi", "n_predict": 1})
    assert "Content-Type" in _raw_names(r) and "content-type" not in _raw_names(r)
    assert dict(r.headers.raw)[b"Server"] == b"llama.cpp"
    r = c.get("/nope")  # errors too
    assert r.status_code == 404 and "Content-Type" in _raw_names(r)


def test_last_stream_chunk_carries_timings(c):
    import json

    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True}
    with_usage = {**body, "stream_options": {"include_usage": True}}
    chunks = [
        json.loads(e)
        for e in sse_events(c.post("/v1/chat/completions", json=with_usage).text)
        if e != "[DONE]"
    ]
    last = chunks[-1]
    assert last["choices"] == [] and "usage" in last and last["timings"]["predicted_n"] == 2
    chunks = [
        json.loads(e) for e in sse_events(c.post("/v1/chat/completions", json=body).text) if e != "[DONE]"
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "timings" in chunks[-1]


_EOS_PROMPT = "<|im_start|>user\nWhat is 2+2? Answer with one number.<|im_end|>\n<|im_start|>assistant\n"


def test_end_of_generation_token_is_a_token_of_its_own(c):
    """As llama-server: the end-of-generation token gets its own stream chunk (id, empty text, counted in
    tokens_predicted), and non-streamed results list it in `tokens` and the probabilities."""
    import json

    body = {"prompt": _EOS_PROMPT, "n_predict": 64, "stop": [".\n"]}
    chunks = [json.loads(e) for e in sse_events(c.post("/completion", json={**body, "stream": True}).text)]
    final, eog = chunks[-1], chunks[-2]
    assert final["stop"] and final["stop_type"] == "eos", final
    # the held-back "." (a prefix of the stop string) leaves with the end-of-generation token
    assert eog["content"] == "." and len(eog["tokens"]) == 1 and not eog["stop"]
    assert eog["tokens_predicted"] == final["tokens_predicted"] == len(chunks) - 1
    eos = eog["tokens"][0]
    full = c.post("/completion", json={**body, "n_probs": 1, "return_tokens": True}).json()
    assert full["tokens"][-1] == eos and len(full["tokens"]) == full["tokens_predicted"]
    probs = full["completion_probabilities"]
    assert len(probs) == full["tokens_predicted"] and probs[-1]["id"] == eos and probs[-1]["token"] == ""
    # OpenAI completions: a chunk per token, empty text included; chat: a token that adds nothing sends nothing
    oai = {"prompt": _EOS_PROMPT, "max_tokens": 64, "stream": True}
    texts = [
        json.loads(e)["choices"][0]["text"] for e in sse_events(c.post("/v1/completions", json=oai).text)[:-1]
    ]
    assert len(texts) == full["tokens_predicted"] + 1 and texts[-2:] == ["", ""]  # the EOG chunk, the last
    chat = {
        "messages": [{"role": "user", "content": "What is 2+2? Answer with one number."}],
        "max_tokens": 64,
    }
    events = [
        json.loads(e)
        for e in sse_events(
            c.post("/v1/chat/completions", json={**chat, "stream": True, "logprobs": True}).text
        )[:-1]
    ]
    assert all(ch["choices"][0]["delta"] or ch["choices"][0]["finish_reason"] for ch in events)
    lp = c.post("/v1/chat/completions", json={**chat, "logprobs": True}).json()
    assert lp["choices"][0]["logprobs"]["content"][-1]["token"] == ""
    assert len(lp["choices"][0]["logprobs"]["content"]) == lp["usage"]["completion_tokens"]


def test_routes_of_features_that_are_off(c):
    err = assert_error(c.post("/v1/audio/transcriptions", files={"file": b"x"}), 501, "not_supported_error")
    assert err["message"] == "The current model does not support audio input."
    ctl = "/v1/chat/completions/control"
    assert assert_error(c.post(ctl, json={}), 400)["message"] == "missing completion id"
    assert (
        assert_error(c.post(ctl, json={"id": "x", "action": "go"}), 400)["message"]
        == "unknown control action"
    )
    r = c.post(ctl, json={"id": "chatcmpl-x", "action": "reasoning_end"})
    assert r.json() == {"success": False, "message": "no active completion for this id"}


@pytest.mark.parametrize(
    "value,status",
    [
        ([], 400),
        ({"content": "string"}, 400),
        ({"content": [{"type": "unknown"}]}, 400),
        ({"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}, 500),
        ({"content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}, 500),
    ],
)
def test_embeddings_reject_what_llamacpp_rejects(c, value, status):
    err = assert_error(c.post("/v1/embeddings", json={"input": value}), status)
    if status == 500:
        assert "input is not supported" in err["message"]


def test_embeddings_content_parts_still_work(c):
    parts = {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}
    a = c.post("/v1/embeddings", json={"input": parts}).json()["data"][0]["embedding"]
    b = c.post("/v1/embeddings", json={"input": "hello world"}).json()["data"][0]["embedding"]
    assert a == b


def test_anthropic_image_in_tool_result_is_not_dropped(c):
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    result = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "text", "text": "File"}, image],
    }
    messages = [
        {"role": "user", "content": "What is in this image?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {"role": "user", "content": [result]},
    ]
    err = assert_error(
        c.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": messages}), 500
    )
    assert "image input is not supported" in err["message"]


def test_vertex_predict(srv, c):
    chat = {"max_tokens": 3, "messages": [{"role": "user", "content": "Say hello"}], "stream": True}
    body = {
        "instances": [
            {"@requestFormat": "chatCompletions", **chat},
            {"@requestFormat": "/v1/chat/completions", **chat},
            {"@requestFormat": "applyTemplate", "messages": chat["messages"]},
            {"@requestFormat": "nope"},
            7,
        ]
    }
    r = c.post("/predict", json=body)
    assert r.status_code == 200
    p = r.json()["predictions"]
    assert len(p) == 5
    assert (
        p[0]["object"] == "chat.completion" and p[0]["choices"][0]["message"]["content"]
    )  # stream forced off
    assert p[1]["choices"][0]["message"]["content"] == p[0]["choices"][0]["message"]["content"]
    assert "Say hello" in p[2]["prompt"]
    assert p[3]["error"]["message"] == "no handler registered for @requestFormat: nope"
    assert p[4]["error"]["message"] == "each instance must be a JSON object"
    assert_error(c.post("/predict", json={"instances": 1}), 400)
    assert_error(c.post("/predict", json={"instances": [{}] * 129}), 400)
    assert c.get("/vertex-health").json() == {"status": "ok"}


def test_several_hosts_and_thinking_off(tmp_path):
    """`--host a,b` listens on both addresses; `-rea off` closes the thinking block that a DeepSeek R1
    template opens, as llama-server's /apply-template shows; `--chat-template NAME` is a built-in."""
    from test_templates_llamacpp import TEMPLATES

    src = TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
    s = start_server(
        tmp_path,
        "-c",
        "512",
        "-np",
        "1",
        "--host",
        "127.0.0.1,::1",
        "--chat-template-file",
        str(src),
        "-rea",
        "off",
    )
    try:
        msgs = {"messages": [{"role": "user", "content": "What is today?"}]}
        for base in (s.base_url, s.base_url.replace("127.0.0.1", "[::1]")):
            r = httpx.post(base + "/apply-template", json=msgs, timeout=60)
            assert r.json()["prompt"].endswith("<｜Assistant｜><think>\n</think>"), r.text
    finally:
        stop_server(s)
