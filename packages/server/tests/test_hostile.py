"""Hostile requests: every case gets a 4xx JSON error, and the server keeps serving (/health 200)."""

from __future__ import annotations

import json

import pytest
from conftest import assert_error

C, CHAT, V1C, EMB, TOK, DETOK, MSGS = (
    "/completion",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/tokenize",
    "/detokenize",
    "/v1/messages",
)
M = [{"role": "user", "content": "Hi"}]


def deep(n: int) -> bytes:
    return b'{"prompt": ' + b"[" * n + b"]" * n + b"}"


def j(obj: object) -> bytes:
    return json.dumps(obj).encode()


CASES: list[tuple[str, str, bytes]] = [
    # malformed bodies
    ("not-json", C, b"{prompt: hi"),
    ("empty-body", C, b""),
    ("json-array-body", C, b"[1, 2, 3]"),
    ("json-string-body", CHAT, b'"hello"'),
    ("nan-literal", C, b'{"prompt": "x", "temperature": NaN}'),
    ("infinity-literal", C, b'{"prompt": "x", "top_p": Infinity}'),
    ("huge-float", C, b'{"prompt": "x", "temperature": 1e999}'),
    ("bad-utf8", C, b'{"prompt": "\xff\xfe\xfa"}'),
    ("bad-utf8-chat", CHAT, b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}'),
    ("deep-nesting-100k", C, deep(100_000)),
    ("deep-nesting-chat", CHAT, b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
    ("truncated-json", CHAT, b'{"messages": [{"role": "user", "content": "Hi"}'),
    # wrong types
    ("prompt-int", C, j({"prompt": 5})),
    ("prompt-bool-list", C, j({"prompt": [True]})),
    ("prompt-object-unknown", C, j({"prompt": {"foo": 1}})),
    ("prompt-empty-list", C, j({"prompt": []})),
    ("prompt-missing", V1C, j({"max_tokens": 1})),
    ("n_predict-string", C, j({"prompt": "x", "n_predict": "ten"})),
    ("temperature-string", C, j({"prompt": "x", "temperature": "hot"})),
    ("top_k-float", C, j({"prompt": "x", "top_k": 1.5})),
    ("stream-string", C, j({"prompt": "x", "stream": "yes"})),
    ("stop-int", C, j({"prompt": "x", "stop": 5})),
    ("stop-list-ints", C, j({"prompt": "x", "stop": [1, 2]})),
    ("samplers-int", C, j({"prompt": "x", "samplers": 5})),
    ("logit_bias-string", C, j({"prompt": "x", "logit_bias": "ban"})),
    ("dry-breakers-empty", C, j({"prompt": "x", "dry_sequence_breakers": []})),
    ("messages-string", CHAT, j({"messages": "hi"})),
    ("messages-missing", CHAT, j({"max_tokens": 1})),
    ("role-int", CHAT, j({"messages": [{"role": 1, "content": "x"}]})),
    ("content-int", CHAT, j({"messages": [{"role": "user", "content": 5}]})),
    ("content-part-unknown", CHAT, j({"messages": [{"role": "user", "content": [{"type": "video_game"}]}]})),
    ("tool_choice-bogus", CHAT, j({"messages": M, "tool_choice": "bogus"})),
    ("top_logprobs-without-logprobs", CHAT, j({"messages": M, "top_logprobs": 2})),
    ("enable_thinking-string", CHAT, j({"messages": M, "chat_template_kwargs": {"enable_thinking": "yes"}})),
    ("anthropic-max_tokens-string", MSGS, j({"messages": M, "max_tokens": "many"})),
    ("anthropic-message-no-role", MSGS, j({"messages": [{"content": "x"}], "max_tokens": 1})),
    ("tokenize-content-int", TOK, j({"content": 5})),
    ("detokenize-strings", DETOK, j({"tokens": ["a"]})),
    ("embeddings-bool", EMB, j({"input": True})),
    ("embeddings-format", EMB, j({"input": "x", "encoding_format": 7})),
    # huge and negative numbers
    ("n_predict-negative", C, j({"prompt": "x", "n_predict": -5})),
    ("n_predict-2^40", C, j({"prompt": "x", "n_predict": 2**40})),
    ("n_predict-2^70", C, j({"prompt": "x", "n_predict": 2**70})),
    ("max_tokens-negative", CHAT, j({"messages": M, "max_tokens": -2})),
    ("n_probs-100k", C, j({"prompt": "x", "n_probs": 100_000})),
    ("n_probs-negative", C, j({"prompt": "x", "n_probs": -1})),
    ("top_logprobs-huge", CHAT, j({"messages": M, "logprobs": True, "top_logprobs": 10**6})),
    ("n-million", CHAT, j({"messages": M, "n": 1_000_000})),
    ("n_cmpl-above-slots", C, j({"prompt": "x", "n_cmpl": 5})),
    ("n-zero", V1C, j({"prompt": "x", "n": 0})),
    ("seed-negative", C, j({"prompt": "x", "seed": -2})),
    ("seed-2^40", C, j({"prompt": "x", "seed": 2**40})),
    ("id_slot-negative", C, j({"prompt": "x", "id_slot": -5})),
    ("n_keep-negative", C, j({"prompt": "x", "n_keep": -2})),
    ("n_discard-negative", C, j({"prompt": "x", "n_discard": -1})),
    ("repeat_last_n-negative", C, j({"prompt": "x", "repeat_last_n": -7})),
    ("min_keep-negative", C, j({"prompt": "x", "min_keep": -1})),
    ("temperature-1e308", C, j({"prompt": "x", "temperature": 1e308})),
    ("repeat_penalty-zero", C, j({"prompt": "x", "repeat_penalty": 0})),
    ("sse_ping-negative", C, j({"prompt": "x", "sse_ping_interval": -9})),
    ("token-id-negative", C, j({"prompt": [-1]})),
    ("token-id-out-of-vocab", C, j({"prompt": [10**9]})),
    ("prompt-too-long", C, j({"prompt": [1] * 3000})),
    ("prompt-1M-chars", C, j({"prompt": "a " * 500_000})),
    ("prompts-many", C, j({"prompt": ["a"] * 65})),
    ("prompts-total-chars", C, j({"prompt": ["x" * 20_000] * 64})),
    ("logit_bias-text-total", C, j({"prompt": "x", "logit_bias": {f"w{i} " * 20: 1 for i in range(1000)}})),
    ("logit_bias-dict-entries", C, j({"prompt": "x", "logit_bias": {str(i): 1 for i in range(5000)}})),
    ("tokenize-list-strings", TOK, j({"content": ["a"] * 5000})),
    ("tokenize-text-total", TOK, j({"content": "t" * 1_100_000})),
    ("embeddings-total-chars", EMB, j({"input": ["e" * 20_000] * 64})),
    ("chat-1M-chars", CHAT, j({"messages": [{"role": "user", "content": "b " * 500_000}]})),
    ("embeddings-1M-chars", EMB, j({"input": "c " * 500_000})),
    ("detokenize-huge-id", DETOK, j({"tokens": [2**40]})),
    ("embeddings-empty", EMB, j({"input": []})),
    ("embeddings-bad-token", EMB, j({"input": [-3]})),
    # slot actions
    ("slot-id-text", "/slots/abc?action=save", j({"filename": "x.bin"})),
    ("slot-filename-traversal", "/slots/0?action=restore", j({"filename": "../../etc/passwd"})),
    ("slot-filename-control", "/slots/0?action=save", j({"filename": "a\x01b"})),
    # grammars and schemas
    (
        "grammar-60000-parens",
        C,
        j({"prompt": "x", "grammar": "root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000}),
    ),
    ("grammar-huge-repeat", C, j({"prompt": "x", "grammar": 'root ::= "a"{1000000000}'})),
    ("grammar-left-recursion", C, j({"prompt": "x", "grammar": 'root ::= root "a" | "b"'})),
    ("grammar-undefined-rule", CHAT, j({"messages": M, "grammar": "root ::= missing"})),
    ("grammar-lazy-no-trigger", C, j({"prompt": "x", "grammar": 'root ::= "a"', "grammar_lazy": True})),
    ("schema-deep", C, b'{"prompt": "x", "json_schema": ' + b'{"items": ' * 5000 + b"{}" + b"}" * 5001),
    (
        "schema-unsupported",
        CHAT,
        j({"messages": M, "response_format": {"type": "json_object", "schema": {"not": {}}}}),
    ),
    ("schema-huge-count", C, j({"prompt": "x", "json_schema": {"type": "string", "minLength": 10**9}})),
]


@pytest.mark.parametrize(("name", "path", "body"), CASES, ids=[c[0] for c in CASES])
def test_hostile_request(client, name, path, body):
    r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:300])
    assert_error(r, r.status_code)
    assert client.get("/health").status_code == 200


BIAS_ENDPOINTS = [
    (C, {"prompt": "x"}),
    (V1C, {"prompt": "x"}),
    (CHAT, {"messages": M}),
    ("/infill", {"input_prefix": "def f(", "input_suffix": "):"}),  # SmolLM2 has no infill: out of range only
]
BIAS_FORMS = [
    ("list-id", lambda b: [[15, b]]),
    ("list-text", lambda b: [["Hello", b]]),
    ("object-id", lambda b: {"15": b}),
    ("object-text", lambda b: {"Hello": b}),
]


@pytest.mark.parametrize("bias", [1e308, -1e308, 1e31, -1e31, 10**40], ids=str)
@pytest.mark.parametrize(("form", "make"), BIAS_FORMS, ids=[f[0] for f in BIAS_FORMS])
@pytest.mark.parametrize(("path", "base"), BIAS_ENDPOINTS, ids=[e[0] for e in BIAS_ENDPOINTS])
def test_logit_bias_out_of_range(client, path, base, form, make, bias):
    """A bias that float32 would turn into infinity (or that is beyond the float fields' ±1e30) is a 400
    naming the field, not a silent ban or boost."""
    r = client.post(path, json={**base, "n_predict": 1, "logit_bias": make(bias)})
    err = assert_error(r, 400, "invalid_request_error")
    assert "logit_bias" in err["message"] and "1e+30" in err["message"], err
    assert client.get("/health").status_code == 200


def test_logit_bias_overflowing_literal(client):
    """A literal beyond float64 is refused as the body is read (before the fields are known)."""
    for bias in (b"[[15, 1e999]]", b'{"15": -1e999}'):
        body = b'{"prompt": "x", "logit_bias": ' + bias + b"}"
        r = client.post(C, content=body, headers={"Content-Type": "application/json"})
        assert "out of range" in assert_error(r, 400)["message"]


@pytest.mark.parametrize(("path", "base"), BIAS_ENDPOINTS[:3], ids=[e[0] for e in BIAS_ENDPOINTS[:3]])
def test_logit_bias_valid_forms(client, path, base):
    """llama.cpp's accepted forms stay accepted: ids and text in both forms, `false` (a ban), the bounds
    themselves; entries of other shapes are skipped, as llama.cpp skips them."""
    for bias in (
        [[15, 1e30], [16, -1e30], ["Hello", 2.5], [17, False], ["world", False], [18, True], [19, "x"], [1]],
        {"15": 1e30, "16": -1e30, "Hello": -0.5, "17": False},
        [],
        {},
    ):
        r = client.post(path, json={**base, "n_predict": 1, "logit_bias": bias})
        assert r.status_code == 200, (bias, r.text[:300])
    if path == C:
        r = client.post(C, json={"prompt": "x", "n_predict": 1, "logit_bias": [[15, 1e30], [17, False]]})
        settings = r.json()["generation_settings"]["logit_bias"]
        assert {"bias": 1e30, "token": 15} in settings and any(e["token"] == 17 for e in settings)


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        (C, {"prompt": "x", "grammar": 'root ::= "a"{0,2147483648}'}, "at most 2000, got 2147483648"),
        (C, {"prompt": "x", "grammar": 'root ::= "a"{2001,}'}, "at most 2000, got 2001"),
        (CHAT, {"messages": M, "grammar": 'root ::= "a"{1000000}'}, "at most 2000, got 1000000"),
        (C, {"prompt": "x", "grammar": 'root ::= "a"{' + "9" * 5000 + "}"}, "at most 2000, got a number of"),
        (
            C,
            {"prompt": "x", "json_schema": {"type": "string", "maxLength": 2**31}},
            "over the supported 2000",
        ),
        (C, {"prompt": "x", "json_schema": {"type": "array", "minItems": 10**6}}, "over the supported 2000"),
        (C, {"prompt": "x", "json_schema": {"type": "string", "pattern": "^a{0,99999}$"}}, "over 2000"),
    ],
    ids=["max", "open-min", "exact-chat", "digits", "maxLength", "minItems", "pattern"],
)
def test_repetition_counts_are_bounded(client, path, body, words):
    r = client.post(path, json={**body, "n_predict": 1})
    assert words in assert_error(r, 400, "invalid_request_error")["message"]
    assert client.get("/health").status_code == 200


def test_oversized_body(client):
    body = b'{"prompt": "' + b"a" * (17 * 1024 * 1024) + b'"}'
    r = client.post(C, content=body, headers={"Content-Type": "application/json"})
    assert_error(r, 413)
    assert client.get("/health").status_code == 200


def test_matrix_size():
    assert len(CASES) + 1 >= 60
