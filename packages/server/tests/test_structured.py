"""Structured output against a real server: grammar, json_schema, response_format, Responses text.format,
CLI defaults, forced tool calls, and bad or hostile grammars (400 in bounded time, server healthy)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest
from conftest import LLAMA_CPP_SRC, Server, assert_error, smollm2_path, start_server, stop_server

MESSAGES = [
    {"role": "system", "content": "You are a coding assistant."},
    {"role": "user", "content": "Write an example"},
]


def chat(client: httpx.Client, **body) -> httpx.Response:
    return client.post("/chat/completions", json={"messages": MESSAGES, **body})


def content(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text[:500]
    return r.json()["choices"][0]["message"]["content"]


# llama.cpp's tools/server/tests/unit/test_chat_completion.py::test_completion_with_response_format
@pytest.mark.parametrize(
    ("response_format", "n_predicted", "re_content"),
    [
        ({"type": "json_object", "schema": {"const": "42"}}, 6, '"42"'),
        ({"type": "json_object", "schema": {"items": [{"type": "integer"}]}}, 10, r"^\[\s*-?\d+\s*\]$"),
        ({"type": "json_schema", "json_schema": {"schema": {"const": "foooooo"}}}, 10, '"foooooo"'),
        ({"type": "json_object"}, 10, r"(\{|John)+"),
        ({"type": "sound"}, 0, None),
        ({"type": "json_object", "schema": 123}, 0, None),
        ({"type": "json_object", "schema": {"type": 123}}, 0, None),
        ({"type": "json_object", "schema": {"type": "hiccup"}}, 0, None),
    ],
)
def test_response_format(
    client: httpx.Client, response_format: dict, n_predicted: int, re_content: str | None
) -> None:
    r = chat(client, max_tokens=n_predicted, response_format=response_format)
    if re_content is None:
        assert_error(r, 400)
    else:
        assert re.search(re_content, content(r)), content(r)


def test_chat_json_schema_and_grammar(client: httpx.Client) -> None:
    assert content(chat(client, max_tokens=6, json_schema={"const": "42"})) == '"42"'
    assert content(chat(client, max_tokens=6, grammar='root ::= "a"{5,5}')) == "aaaaa"
    err = assert_error(chat(client, grammar='root ::= "a"', json_schema={"const": 1}), 500)
    assert err["message"] == "Cannot use both json_schema and grammar"


def test_native_completion(client: httpx.Client) -> None:
    r = client.post(
        "/completion", json={"prompt": "Say:", "n_predict": 8, "grammar": 'root ::= "yes" | "no"'}
    )
    assert r.status_code == 200 and r.json()["content"] in ("yes", "no")
    r = client.post(
        "/completion",
        json={
            "prompt": "Number:",
            "n_predict": 8,
            "json_schema": {"type": "integer", "minimum": 10, "maximum": 99},
        },
    )
    assert 10 <= json.loads(r.json()["content"]) <= 99
    # grammar wins over json_schema on the native routes (as llama.cpp)
    r = client.post(
        "/completion",
        json={"prompt": "x", "n_predict": 4, "grammar": 'root ::= "ok"', "json_schema": {"const": 1}},
    )
    assert r.json()["content"] == "ok"
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, "grammar": 'root ::= "ok"'})
    assert r.json()["choices"][0]["text"] == "ok"


def test_stream_with_grammar(client: httpx.Client) -> None:
    r = client.post(
        "/completion", json={"prompt": "x", "n_predict": 6, "stream": True, "grammar": 'root ::= "a"{5}'}
    )
    pieces = [json.loads(line[6:]) for line in r.text.split("\n") if line.startswith("data: ")]
    assert "".join(p["content"] for p in pieces) == "aaaaa"


def test_responses_text_format(client: httpx.Client) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 10}},
        "required": ["name"],
        "additionalProperties": False,
    }
    r = client.post(
        "/v1/responses",
        json={
            "input": "Give a name",
            "max_output_tokens": 30,
            "text": {"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}},
        },
    )
    assert r.status_code == 200, r.text
    text = r.json()["output"][-1]["content"][0]["text"]
    jsonschema.validate(json.loads(text), schema)


def test_lazy_grammar_fields(client: httpx.Client) -> None:
    assert_error(
        client.post("/completion", json={"prompt": "x", "grammar": 'root ::= "a"', "grammar_lazy": True}), 400
    )
    r = client.post(
        "/completion",
        json={
            "prompt": "x",
            "n_predict": 4,
            "grammar": 'root ::= "a"',
            "grammar_lazy": True,
            "grammar_triggers": [{"type": 2, "value": "zzzz"}],
        },
    )
    assert r.status_code == 200, r.text
    r = client.post(
        "/completion",
        json={
            "prompt": "x",
            "n_predict": 1,
            "grammar": 'root ::= "a"',
            "grammar_lazy": True,
            "grammar_triggers": [{"type": 9, "value": "a"}],
        },
    )
    assert_error(r, 400)


def test_schema_refused_names_the_feature(client: httpx.Client) -> None:
    err = assert_error(
        chat(
            client,
            response_format={
                "type": "json_schema",
                "json_schema": {"schema": {"type": "number", "multipleOf": 3}},
            },
        ),
        400,
    )
    assert "multipleOf" in err["message"]


HOSTILE = [
    "root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000,
    'root ::= "a"{1000000000}',
    'root ::= root "a" | "b"',
    "root ::= undefined-rule",
    "root ::= this is (not valid GBNF",
    "root ::= [a-",
    "",
]


@pytest.mark.parametrize(
    "grammar",
    HOSTILE,
    ids=["nested-60000", "huge-repeat", "left-recursion", "undefined", "broken", "open-class", "no-root"],
)
def test_hostile_grammar_is_400(client: httpx.Client, grammar: str) -> None:
    t0 = time.monotonic()
    r = chat(client, max_tokens=4, grammar=grammar or 'x ::= "a"')
    assert_error(r, 400)
    assert time.monotonic() - t0 < 10
    assert client.get("/health").status_code == 200


# -- tool calls --------------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]},
    },
}


def test_tool_choice_required(client: httpx.Client) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [WEATHER, TIME],
            "tool_choice": "required",
            "max_tokens": 60,
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    calls = choice["message"].get("tool_calls")
    assert calls, choice
    assert choice["finish_reason"] == "tool_calls"
    for call in calls:
        assert call["function"]["name"] in ("get_weather", "get_time")
        json.loads(call["function"]["arguments"])


def test_tool_choice_named_and_not_parallel(client: httpx.Client) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [WEATHER, TIME],
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
            "parallel_tool_calls": False,
            "max_tokens": 60,
        },
    )
    assert r.status_code == 200, r.text
    calls = r.json()["choices"][0]["message"].get("tool_calls")
    assert calls, r.json()
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_time"
    assert json.loads(calls[0]["function"]["arguments"])["tz"] in ("UTC", "CET")
    bad = {"type": "function", "function": {"name": "nope"}}
    assert_error(
        client.post(
            "/v1/chat/completions", json={"messages": MESSAGES, "tools": [WEATHER], "tool_choice": bad}
        ),
        400,
    )
    err = assert_error(chat(client, tools=[WEATHER], grammar='root ::= "a"'), 400)
    assert err["message"] == "Cannot use custom grammar constraints with tools."


# -- server defaults -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def schema_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("jserver")
    path = tmp / "schema.json"
    path.write_text(json.dumps({"type": "integer", "minimum": 1, "maximum": 9}))
    s = start_server(tmp, "-c", "512", "-np", "1", "--temp", "0", "--no-warmup", "-jf", str(path))
    yield s
    stop_server(s)


def test_cli_default_schema(schema_server: Server) -> None:
    with schema_server.client() as c:
        r = c.post("/completion", json={"prompt": "A digit:", "n_predict": 4})
        assert 1 <= int(r.json()["content"]) <= 9
        r = c.post("/completion", json={"prompt": "x", "n_predict": 4, "grammar": 'root ::= "z"'})
        assert r.json()["content"] == "z"


def test_cli_bad_grammar_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "g.gbnf"
    bad.write_text("root ::= (")
    out = subprocess.run(
        [sys.executable, "-m", "llama_server", "--grammar-file", str(bad), "-m", str(smollm2_path())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "grammar" in (out.stderr + out.stdout)
    out = subprocess.run(
        [sys.executable, "-m", "llama_server", "-j", '{"type": "kaboom"}', "-m", str(smollm2_path())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "kaboom" in (out.stderr + out.stdout)


def _template(name: str):
    from llama_server.template import ChatTemplate

    return ChatTemplate((LLAMA_CPP_SRC / "models" / "templates" / name).read_text())


def _accepts(grammar: str, text: str) -> bool:
    from llama_engine.grammar import parse_grammar
    from llama_engine.grammar.compiled import DEAD, CompiledGrammar

    g = CompiledGrammar(parse_grammar(grammar))
    sid = g.walk(g.initial, [ord(c) for c in text])
    return sid != DEAD and g.can_end[sid]


def test_tool_grammar_hermes_formats() -> None:
    import msgspec

    from llama_server.schemas import ChatBody
    from llama_server.structured import tool_call_grammar

    template = _template("Qwen-Qwen2.5-7B-Instruct.jinja")
    base = {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER, TIME]}
    one = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
    two = one + "\n" + one.replace("UTC", "CET")
    auto = msgspec.convert({**base, "parallel_tool_calls": False}, ChatBody)
    got = tool_call_grammar(auto, template)
    assert got is not None and got[1] == "<tool_call>"  # lazy: triggered by the opening tag
    assert _accepts(got[0], one) and not _accepts(got[0], two)
    assert tool_call_grammar(msgspec.convert(base, ChatBody), template) is None  # auto, parallel: free
    req = tool_call_grammar(msgspec.convert({**base, "tool_choice": "required"}, ChatBody), template)
    assert req is not None and req[1] == ""
    assert _accepts(req[0], two) and not _accepts(req[0], "hello")
    assert not _accepts(req[0], one.replace("UTC", "PST"))
