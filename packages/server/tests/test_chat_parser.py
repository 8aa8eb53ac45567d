"""Reasoning and tool-call extraction, streaming diffs included."""

from __future__ import annotations

import json

from llama_server.chat_parser import ChatParser


def test_reasoning_split():
    p = ChatParser(reasoning=True, tools=False).parse("<think>hmm</think>\n\nAnswer", final=True)
    assert (p.reasoning, p.content) == ("hmm", "Answer")
    assert ChatParser(False, False).parse("<think>hmm</think>A", final=True).content == "<think>hmm</think>A"


def test_reasoning_stream_holds_partial_tags():
    parser = ChatParser(True, False)
    assert parser.parse("<thi", final=False).content == ""
    p = parser.parse("<think>abc</thi", final=False)
    assert p.reasoning == "abc" and p.content == ""


def test_hermes_tool_call():
    text = 'ok <tool_call>\n{"name": "get", "arguments": {"city": "Paris"}}\n</tool_call>'
    parser = ChatParser(False, True)
    p = parser.parse(text, final=True)
    assert p.content == "ok " and p.tool_calls[0].name == "get"
    assert json.loads(p.tool_calls[0].arguments) == {"city": "Paris"}
    assert parser.parse(text, final=True).tool_calls[0].id == p.tool_calls[0].id  # stable across re-parses
    assert ChatParser(False, True).parse("ok <tool_c", final=False).content == "ok "


def test_llama3_and_mistral_tool_calls():
    p = ChatParser(False, True).parse('{"name": "f", "parameters": {"x": 1}}', final=True)
    assert p.tool_calls[0].name == "f" and p.content == ""
    p = ChatParser(False, True).parse('[TOOL_CALLS][{"name": "g", "arguments": {}}]', final=True)
    assert p.tool_calls[0].name == "g"
    p = ChatParser(False, True).parse("{not json", final=True)
    assert p.content == "{not json" and not p.tool_calls


def test_stream_diffs_rebuild_the_final_message():
    """Feeding a reply piece by piece and adding up the diffs gives the same message as parsing it whole."""
    from llama_server.chat_parser import ParsedStream

    reply = '<think>plan</think>\n\nCalling. <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    stream = ParsedStream(reasoning=True, tools=True)
    reasoning, content, calls = "", "", []
    pieces = [reply[i : i + 3] for i in range(0, len(reply), 3)]
    for n, piece in enumerate(pieces):
        d = stream.feed(piece, final=n == len(pieces) - 1)
        assert d.first_call == len(calls)
        reasoning, content, calls = reasoning + d.reasoning, content + d.content, calls + d.calls
    whole = ChatParser(reasoning=True, tools=True).parse(reply, final=True)
    assert reasoning == whole.reasoning == "plan"
    assert content == whole.content == "Calling. "
    assert [c.name for c in calls] == ["f"] and json.loads(calls[0].arguments) == {"a": 1}
    assert calls[0].id == stream.last.tool_calls[0].id  # the same id in every parse
