"""The output formats of gpt-oss (Harmony), Qwen3-Coder / Qwen3.5 (XML calls) and Gemma 4, on the cases of
llama.cpp's tests/test-chat.cpp: the whole text parses to the expected message, and the text streamed one
character at a time gives deltas that add up to the same message (whitespace at the ends compared as
llama.cpp compares it, stripped)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import LLAMA_CPP_SRC

from llama_server.chat_format import ChatFormat, detect_format, make_parser
from llama_server.chat_parser import ParsedStream
from llama_server.gemma4_parser import gemma4_value

TEMPLATES = LLAMA_CPP_SRC / "models" / "templates"


def _tool(name: str, props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    params = {"type": "object", "properties": props, "required": required or list(props)}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": params}}


SPECIAL = _tool("special_function", {"arg1": {"type": "integer"}})
SPECIAL_OPT = _tool(
    "special_function_with_opt", {"arg1": {"type": "integer"}, "arg2": {"type": "integer"}}, ["arg1"]
)
PYTHON = _tool("python", {"code": {"type": "string"}})
EDIT = _tool(
    "edit", {"filename": {"type": "string"}, "oldString": {"type": "string"}, "newString": {"type": "string"}}
)
TERMINAL = _tool("run_in_terminal", {"command": {"type": "string"}})
EMPTY = _tool("empty_args", {})
TODO = _tool(
    "todo_list",
    {"todos": {"type": "array", "items": {"type": "object", "properties": {"item": {"type": "string"}}}}},
)
MAGIC = _tool("magic", {"name": {"type": "string"}, "ref": {"type": "string"}})
AMOUNT = _tool("amount", {"orig": {"type": "number"}})
MIXED = _tool("mixed", {"v": {"type": ["string", "number"]}})
GET_TIME = _tool("get_time", {"city": {"type": "string"}})
GET_WEATHER = _tool("get_weather", {"city": {"type": "string"}})
TOGGLE = _tool("toggle", {"enabled": {"type": "boolean"}})
CONFIG = _tool("set_config", {"config": {"type": "object"}})
EDIT_OSS = _tool(
    "edit",
    {"oldString": {"type": "string"}, "newString": {"type": "string"}, "replaceAll": {"type": "boolean"}},
    ["oldString", "newString"],
)
XML_CALL = (
    "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>"
)
PWD = "<tool_call>\n<function=run_in_terminal>\n<parameter=command>\npwd\n</parameter>\n</function>\n</tool_call>"


def check(parser_args: dict[str, Any], text: str, reasoning="", content="", calls=(), partial=False):
    """The whole text and its character-by-character stream both give the expected message."""
    stream = ParsedStream(False, False, parser=make_parser(**parser_args))
    got_r, got_c, got_calls = "", "", []
    for i in range(1, len(text) + 1):
        d = stream.feed(text[i - 1], final=i == len(text) and not partial)
        assert d.first_call == len(got_calls)
        got_r, got_c, got_calls = got_r + d.reasoning, got_c + d.content, got_calls + d.calls
        # what was sent is a prefix of every later parse: nothing sent is ever taken back
        assert d.parsed.reasoning.startswith(got_r) and d.parsed.content.startswith(got_c), (i, d.parsed)
    whole = stream.last if partial else make_parser(**parser_args).parse(text, final=True)
    for msg_r, msg_c, msg_calls in (
        (got_r, got_c, got_calls),
        (whole.reasoning, whole.content, whole.tool_calls),
    ):
        assert msg_r.strip() == reasoning.strip()
        assert msg_c.strip() == content.strip()
        assert [(c.name, json.loads(c.arguments)) for c in msg_calls] == [
            (n, json.loads(a)) for n, a in calls
        ]


def oss(reasoning=True, tools=None):
    return {"fmt": ChatFormat.GPT_OSS, "reasoning": reasoning, "tools": tools}


def qwen(reasoning=True, tools=None, forced_open=True, thinking=True):
    return {
        "fmt": ChatFormat.QWEN3_CODER,
        "reasoning": reasoning,
        "tools": tools,
        "forced_open": forced_open,
        "thinking": thinking,
    }


def gemma(reasoning=True, tools=None):
    return {"fmt": ChatFormat.GEMMA4, "reasoning": reasoning, "tools": tools}


HELLO = "Hello, world!\nWhat's up?"


@pytest.mark.parametrize(
    "name,fmt",
    [
        ("openai-gpt-oss-120b", ChatFormat.GPT_OSS),
        ("Qwen3.5-4B", ChatFormat.QWEN3_CODER),
        ("Qwen3-Coder", ChatFormat.QWEN3_CODER),
        ("google-gemma-4-31B-it", ChatFormat.GEMMA4),
        ("google-gemma-4-31B-it-interleaved", ChatFormat.GEMMA4),
        ("Qwen-Qwen3-0.6B", ChatFormat.GENERIC),
        ("llm-jp-llm-jp-4.1-8b-thinking", ChatFormat.GENERIC),
    ],
)
def test_format_detected_from_the_template(name, fmt):
    assert detect_format((TEMPLATES / f"{name}.jinja").read_text()) == fmt


# gpt-oss (test-chat.cpp "GPT-OSS format tests")
ANALYSIS = "<|channel|>analysis<|message|>I'm\nthinking<|end|>"


@pytest.mark.parametrize(
    "args,text,expect",
    [
        (oss(False), "<|channel|>final<|message|>" + HELLO, ("", HELLO, [])),
        (oss(False), "<|channel|>commentary<|message|>" + HELLO, ("", HELLO, [])),
        (
            oss(),
            ANALYSIS + "<|start|>assistant<|channel|>final<|message|>" + HELLO,
            ("I'm\nthinking", HELLO, []),
        ),
        (
            oss(False),
            ANALYSIS + "<|start|>assistant<|channel|>final<|message|>" + HELLO,
            ("", "<|channel|>analysis<|message|>I'm\nthinking<|end|>" + HELLO, []),
        ),
        (
            oss(tools=[SPECIAL]),
            ' to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}',
            ("", "", [("special_function", '{"arg1": 1}')]),
        ),
        (
            oss(tools=[SPECIAL]),
            '<|channel|>analysis to=functions.special_function<|message|>{"arg1": 1}',
            ("", "", [("special_function", '{"arg1": 1}')]),
        ),
        (
            oss(tools=[SPECIAL]),
            ' to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{"arg1": 1}',
            ("", "", [("special_function", '{"arg1": 1}')]),
        ),
        (
            oss(tools=[SPECIAL]),
            '<|channel|>commentary to=functions.special_function<|message|>{"arg1": 1}',
            ("", "", [("special_function", '{"arg1": 1}')]),
        ),
        (
            oss(tools=[SPECIAL]),
            ANALYSIS
            + '<|start|>assistant to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}',
            ("I'm\nthinking", "", [("special_function", '{"arg1": 1}')]),
        ),
        (
            oss(tools=[EDIT_OSS]),
            "<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant<|channel|>commentary"
            ' to=functions.edit <|constrain|>json<|message|>{"oldString": "if (part < railCount - 1) {",'
            ' "newString": "if (part < 4) {", "replaceAll": false}',
            (
                "Thinking about edit...",
                "",
                [
                    (
                        "edit",
                        '{"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", "replaceAll": false}',
                    )
                ],
            ),
        ),
        (
            oss(),
            "<|channel|>analysis<|message|>I will execute python to say hello<|end|>"
            "<|start|>assistant to=container.exec<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'",
            ("I will execute python to say hello", "", []),
        ),
        (
            oss(),
            "<|channel|>analysis<|message|>I will execute python to say hello<|end|>"
            '<|start|>assistant<|channel|>commentary to=python <|constrain|>code<|message|>print("hello")',
            ("I will execute python to say hello", "", []),
        ),
        (
            oss(),
            "<|channel|>commentary to=assistant"
            + ANALYSIS
            + "<|start|>assistant<|channel|>final<|message|>"
            + HELLO,
            ("I'm\nthinking", HELLO, []),
        ),
        (
            oss(),
            ANALYSIS
            + "<|start|>assistant<|channel|>commentary to=assistant<|channel|>final<|message|>"
            + HELLO,
            ("I'm\nthinking", HELLO, []),
        ),
        # a preamble, then two calls, each ended by the <|call|> token kept in the text
        (
            oss(tools=[SPECIAL, GET_TIME]),
            "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary"
            ' to=functions.special_function <|constrain|>json<|message|>{"arg1": 1}<|call|><|start|>assistant'
            '<|channel|>commentary to=functions.get_time json<|message|>{"city": "Paris"}<|call|>',
            ("", "Checking.", [("special_function", '{"arg1": 1}'), ("get_time", '{"city": "Paris"}')]),
        ),
    ],
)
def test_gpt_oss(args, text, expect):
    r, c, calls = expect
    check(args, text, r, c, calls)


def test_gpt_oss_partial_reasoning_and_held_tags():
    check(oss(), "<|channel|>analysis<|message|>I'm\nthinking", "I'm\nthinking", partial=True)
    p = make_parser(**oss(tools=[SPECIAL]))
    assert p.parse("<|channel|>analysis<|message|>x<|en", final=False).reasoning == "x"
    assert p.parse("<|channel|>analysis<|message|>x<|end|><|start|>assis", final=False).content == ""
    # a call's arguments count once they are a whole JSON object
    assert not p.parse(
        '<|channel|>commentary to=functions.special_function<|message|>{"arg1": ', False
    ).tool_calls
    # without tools in the request, a function call is dropped like a built-in's
    assert (
        make_parser(**oss()).parse('<|channel|>commentary to=functions.f<|message|>{"a": 1}', True).tool_calls
        == []
    )


# Qwen3.5 and Qwen3-Coder (test-chat.cpp "Qwen3.5" and "Qwen3-Coder")
@pytest.mark.parametrize(
    "args,text,expect",
    [
        (qwen(), "I'm\nthinking\n</think>\n\n" + HELLO, ("I'm\nthinking", HELLO, [])),
        (
            qwen(False),
            "I'm\nthinking\n</think>\n\n" + HELLO,
            ("", "<think>\nI'm\nthinking\n</think>\n\n" + HELLO, []),
        ),
        (qwen(tools=[SPECIAL], forced_open=False), XML_CALL, ("", "", [("special_function", '{"arg1": 1}')])),
        (
            qwen(tools=[SPECIAL]),
            "I'm\nthinking\n</think>\n\n" + XML_CALL,
            ("I'm\nthinking", "", [("special_function", '{"arg1": 1}')]),
        ),
        (
            qwen(tools=[SPECIAL, SPECIAL_OPT], forced_open=False),
            XML_CALL
            + "\n<tool_call>\n<function=special_function_with_opt>\n<parameter=arg1>\n1\n</parameter>\n"
            "<parameter=arg2>\n2\n</parameter>\n</function>\n</tool_call>",
            (
                "",
                "",
                [
                    ("special_function", '{"arg1": 1}'),
                    ("special_function_with_opt", '{"arg1": 1, "arg2": 2}'),
                ],
            ),
        ),
        (
            qwen(tools=[PYTHON], forced_open=False),
            '<tool_call>\n<function=python>\n<parameter=code>\ndef hello():\n    print("Hello, world!")\n\nhello()\n'
            "</parameter>\n</function>\n</tool_call>",
            (
                "",
                "",
                [("python", json.dumps({"code": 'def hello():\n    print("Hello, world!")\n\nhello()'}))],
            ),
        ),
        (
            qwen(tools=[EDIT], forced_open=False),
            "<tool_call>\n<function=edit>\n<parameter=filename>\nfoo.c\n</parameter>\n<parameter=oldString>\n"
            "#iclunde\n</parameter>\n<parameter=newString>\n#include\n\n</parameter>\n</function>\n</tool_call>",
            (
                "",
                "",
                [
                    (
                        "edit",
                        json.dumps({"filename": "foo.c", "oldString": "#iclunde", "newString": "#include\n"}),
                    )
                ],
            ),
        ),
        (
            qwen(tools=[PYTHON], forced_open=False),
            '<tool_call>\n<function=python>\n<parameter=code>\n    print("Hello, world!")\n</parameter>\n'
            "</function>\n</tool_call>",
            ("", "", [("python", json.dumps({"code": '    print("Hello, world!")'}))]),
        ),
        (qwen(tools=[TERMINAL]), PWD, ("", "", [("run_in_terminal", '{"command": "pwd"}')])),
        (
            qwen(tools=[TERMINAL]),
            "Need to inspect the current directory.\n" + PWD,
            ("Need to inspect the current directory.", "", [("run_in_terminal", '{"command": "pwd"}')]),
        ),
        (
            qwen(tools=[EMPTY], forced_open=False),
            "<tool_call>\n<function=empty_args>\n</function>\n</tool_call>",
            ("", "", [("empty_args", "{}")]),
        ),
        (
            qwen(tools=[SPECIAL]),
            "<think>\n\n</think>\n\n" + XML_CALL,
            ("<think>", "", [("special_function", '{"arg1": 1}')]),
        ),
        (qwen(tools=[SPECIAL]), "</think>\n\n" + XML_CALL, ("", "", [("special_function", '{"arg1": 1}')])),
        (
            qwen(tools=[TERMINAL]),
            "I should inspect the directory.\n</think>\n\nLet me inspect it now.\n" + PWD,
            (
                "I should inspect the directory.",
                "Let me inspect it now.\n",
                [("run_in_terminal", '{"command": "pwd"}')],
            ),
        ),
        (
            qwen(tools=[MAGIC]),
            "Let me call the magic tool\n</think>\n<tool_call>\n<function=magic>\n<parameter=name>\nfooBar\n"
            "</parameter>\n<parameter=ref>\n5123123\n</parameter>\n</function>\n</tool_call>",
            ("Let me call the magic tool", "", [("magic", '{"name": "fooBar", "ref": "5123123"}')]),
        ),
        # Qwen3-Coder (no thinking): the first <tool_call> may be missing
        (qwen(False, [SPECIAL], False, False), HELLO, ("", HELLO, [])),
        (
            qwen(False, [SPECIAL], False, False),
            "Let me call it.\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
            ("", "Let me call it.\n", [("special_function", '{"arg1": 1}')]),
        ),
        (
            qwen(False, [TODO], False, False),
            '<tool_call>\n<function=todo_list>\n<parameter=todos>\n[{"item": "Check stuff", "selected": false}]\n'
            "</parameter>\n</function>\n</tool_call>",
            ("", "", [("todo_list", '{"todos": [{"item": "Check stuff", "selected": false}]}')]),
        ),
        (
            qwen(False, [PYTHON], False, False),
            "<tool_call>\n<function=python>\n<parameter=code>\n格\n</parameter>\n</function>\n</tool_call>",
            ("", "", [("python", '{"code": "格"}')]),
        ),
        # a value that may be a string or a number: a number when it reads as one
        (
            qwen(False, [MIXED], False, False),
            "<tool_call>\n<function=mixed>\n<parameter=v>\n42\n</parameter>\n</function>\n</tool_call>",
            ("", "", [("mixed", '{"v": 42}')]),
        ),
        (
            qwen(False, [MIXED], False, False),
            "<tool_call>\n<function=mixed>\n<parameter=v>\n42 apples\n</parameter>\n</function>\n</tool_call>",
            ("", "", [("mixed", '{"v": "42 apples"}')]),
        ),
    ],
)
def test_qwen_xml(args, text, expect):
    r, c, calls = expect
    check(args, text, r, c, calls)


def test_qwen_xml_holds_partial_tags():
    p = make_parser(**qwen(tools=[SPECIAL]))
    assert p.parse("thinking</thi", final=False).reasoning == "thinking"
    assert p.parse("t</think>\n\nSome text<tool_", final=False).content == "Some text"
    # a call counts only once its function is closed
    assert p.parse("t</think>" + XML_CALL[:40], final=False).tool_calls == []


# Gemma 4 (test-chat.cpp "Google Gemma 4")
@pytest.mark.parametrize(
    "args,text,expect",
    [
        (gemma(False), "Hello, world!", ("", "Hello, world!", [])),
        (gemma(), "<|channel>thought\nI'm\nthinking<channel|>" + HELLO, ("I'm\nthinking", HELLO, [])),
        (gemma(), "<|channel>thought<channel|>" + HELLO, ("", HELLO, [])),
        (
            gemma(False),
            "<|channel>thought\nI'm\nthinking<channel|>" + HELLO,
            ("", "<|channel>thought\nI'm\nthinking<channel|>" + HELLO, []),
        ),
        (
            gemma(False, [GET_TIME]),
            '<|tool_call>call:get_time{city:<|"|>San Francisco<|"|>}<tool_call|>',
            ("", "", [("get_time", '{"city": "San Francisco"}')]),
        ),
        (
            gemma(False, [EMPTY]),
            "<|tool_call>call:empty_args{}<tool_call|>",
            ("", "", [("empty_args", "{}")]),
        ),
        (
            gemma(False, [GET_TIME]),
            HELLO + '<|tool_call>call:get_time{city:<|"|>Paris<|"|>}<tool_call|>',
            ("", HELLO, [("get_time", '{"city": "Paris"}')]),
        ),
        (
            gemma(True, [GET_TIME]),
            '<|channel>thought\nI\'m\nthinking<channel|><|tool_call>call:get_time{city:<|"|>Paris<|"|>}<tool_call|>',
            ("I'm\nthinking", "", [("get_time", '{"city": "Paris"}')]),
        ),
        (
            gemma(False, [GET_TIME, GET_WEATHER]),
            '<|tool_call>call:get_time{city:<|"|>London<|"|>}<tool_call|>'
            '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
            ("", "", [("get_time", '{"city": "London"}'), ("get_weather", '{"city": "Paris"}')]),
        ),
        (
            gemma(False, [SPECIAL]),
            "<|tool_call>call:special_function{arg1:-7}<tool_call|>",
            ("", "", [("special_function", '{"arg1": -7}')]),
        ),
        (
            gemma(False, [AMOUNT]),
            "<|tool_call>call:amount{orig:1.5e10}<tool_call|>",
            ("", "", [("amount", '{"orig": 1.5e10}')]),
        ),
        (
            gemma(False, [TOGGLE]),
            "<|tool_call>call:toggle{enabled:false}<tool_call|>",
            ("", "", [("toggle", '{"enabled": false}')]),
        ),
        (
            gemma(False, [TODO]),
            '<|tool_call>call:todo_list{todos:[<|"|>buy milk<|"|>,<|"|>walk dog<|"|>]}<tool_call|>',
            ("", "", [("todo_list", '{"todos": ["buy milk", "walk dog"]}')]),
        ),
        (
            gemma(False, [CONFIG]),
            '<|tool_call>call:set_config{config:{theme:<|"|>dark<|"|>,count:3}}<tool_call|>',
            ("", "", [("set_config", '{"config": {"theme": "dark", "count": 3}}')]),
        ),
        (
            gemma(False, [CONFIG]),
            "<|tool_call>call:set_config{config:{}}<tool_call|>",
            ("", "", [("set_config", '{"config": {}}')]),
        ),
        (gemma(), "<|channel>thought\n<channel|>" + HELLO + "<channel|>", ("", HELLO, [])),
        (gemma(), "<|channel>thought\n<channel|>" + HELLO + "<|channel>thought\n<channel|>", ("", HELLO, [])),
        (
            gemma(),
            "<|channel>thought\n<channel|>" + HELLO + "<|channel>thought\n<channel|><channel|>",
            ("", HELLO, []),
        ),
        (gemma(), "<|channel><|channel>thought\n<channel|>" + HELLO, ("", HELLO, [])),
    ],
)
def test_gemma4(args, text, expect):
    r, c, calls = expect
    check(args, text, r, c, calls)


def test_gemma4_values_and_hostile_input():
    text = '{a:[1,{b:<|"|>x, y<|"|>}],c:null}'
    assert gemma4_value(text) == ({"a": [1, {"b": "x, y"}], "c": None}, len(text))
    p = make_parser(**gemma(False, [GET_TIME]))
    # an unterminated call is not a call while streaming, and stays as written at the end
    assert p.parse('<|tool_call>call:get_time{city:<|"|>Par', final=False).tool_calls == []
    bad = p.parse("<|tool_call>call:get_time{city:Paris}<tool_call|>", final=True)
    assert [(c.name, c.arguments) for c in bad.tool_calls] == [("get_time", "{city:Paris}")]
    assert p.parse("Hi<|chan", final=False).content == "Hi"


# The prompt side against a real server: SmolLM2 cannot write these formats, but /apply-template renders
# prior reasoning and tool calls as the template expects them (llama.cpp's rewrites for each format). The
# templates show an assistant's reasoning only after the last user message: the conversation ends in a tool
# result.
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "The user wants the weather.",
        "tool_calls": [
            {
                "id": "c0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c0", "content": '{"sky": "sunny"}'},
]
CALL_ARGS = {"city": "Paris"}


def _expected_messages(name: str) -> list[dict[str, Any]]:
    """The messages as llama.cpp hands them to each template."""
    out = [dict(m) for m in CONVERSATION]
    out[1]["tool_calls"] = [
        {**out[1]["tool_calls"][0], "function": {"name": "get_weather", "arguments": CALL_ARGS}}
    ]
    if name == "openai-gpt-oss-120b":  # reasoning as `thinking`; a message with calls loses its content
        for m in out:
            if "reasoning_content" in m:
                m["thinking"] = m["reasoning_content"]
        del out[1]["content"]
    return out


@pytest.fixture(scope="module", params=["openai-gpt-oss-120b", "Qwen3.5-4B", "google-gemma-4-31B-it"])
def format_server(request, tmp_path_factory):
    from conftest import start_server, stop_server

    tmp = tmp_path_factory.mktemp("format")
    path = TEMPLATES / f"{request.param}.jinja"
    s = start_server(tmp, "--jinja", "--chat-template-file", str(path), "-c", "512", "-np", "1")
    yield request.param, s
    stop_server(s)


def test_prompt_renders_reasoning_and_calls(format_server):
    from llama_server.template import ChatTemplate

    name, server = format_server
    with server.client() as c:
        body = {"messages": CONVERSATION, "tools": [GET_WEATHER]}
        prompt = c.post("/apply-template", json=body).json()["prompt"]
        props = c.get("/props").json()
    tmpl = ChatTemplate(
        (TEMPLATES / f"{name}.jinja").read_text(), props.get("bos_token", ""), props.get("eos_token", "")
    )
    kwargs = {"enable_thinking": True, "preserve_reasoning": True}
    expected = tmpl.render(_expected_messages(name), True, [GET_WEATHER], kwargs)
    assert prompt == expected
    marks = {
        "openai-gpt-oss-120b": (
            "<|start|>assistant<|channel|>analysis<|message|>The user wants the weather.<|end|>",
            'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
        ),
        "Qwen3.5-4B": (
            "<think>\nThe user wants the weather.\n</think>",
            "<parameter=city>\nParis\n</parameter>",
        ),
        "google-gemma-4-31B-it": (
            "<|channel>thought\nThe user wants the weather.\n<channel|>",
            'call:get_weather{city:<|"|>Paris<|"|>}',
        ),
    }[name]
    for mark in marks:
        assert mark in prompt, (mark, prompt[-600:])
