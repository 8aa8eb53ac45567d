"""Gemma 4's output: `<|channel>thought ...<channel|>` reasoning, content, and tool calls written in
Gemma's own literal syntax (llama.cpp's `common_chat_params_init_gemma4` and `gemma4_to_json`):

    <|channel>thought
    reasoning<channel|>content<|tool_call>call:NAME{key:<|"|>text<|"|>,n:42,list:[1,2],obj:{a:true}}<tool_call|>

Strings are quoted with `<|"|>`, keys are bare, numbers, `true`, `false` and `null` are JSON's. Empty
`<|channel>` tokens before a thought are skipped; the model's stray trailing `<channel|>` ends the reply.
Text after the tool calls is dropped, as llama.cpp drops it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .chat_parser import Parsed, ToolCall, held_prefix, keep_ids

__all__ = ["Gemma4Parser", "gemma4_value"]

TURN = "<|turn>model\n"
CHANNEL_OPEN, CHANNEL_CLOSE = "<|channel>", "<channel|>"
THOUGHT = CHANNEL_OPEN + "thought"
CALL_OPEN, CALL_CLOSE = "<|tool_call>call:", "<tool_call|>"
QUOTE = '<|"|>'
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}


class _Syntax(ValueError):
    pass


def gemma4_value(text: str, pos: int = 0) -> tuple[Any, int]:
    """Read one Gemma 4 value at `pos`: (the value, the position after it). Raises ValueError."""
    if text.startswith(QUOTE, pos):
        end = text.find(QUOTE, pos + len(QUOTE))
        if end < 0:
            raise _Syntax("unterminated string")
        return text[pos + len(QUOTE) : end], end + len(QUOTE)
    if text.startswith("{", pos):
        return _dict(text, pos + 1)
    if text.startswith("[", pos):
        return _list(text, pos + 1)
    for word, value in _LITERALS.items():
        if text.startswith(word, pos):
            return value, pos + len(word)
    m = _NUMBER.match(text, pos)
    if m is None:
        raise _Syntax(f"no value at {pos}")
    return json.loads(m.group(0)), m.end()


def _space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _dict(text: str, pos: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    pos = _space(text, pos)
    if text.startswith("}", pos):
        return out, pos + 1
    while True:
        colon = pos
        while colon < len(text) and text[colon] not in ":}":
            colon += 1
        if colon >= len(text) or text[colon] != ":" or colon == pos:
            raise _Syntax("bad key")
        key = text[pos:colon].strip()
        out[key], pos = gemma4_value(text, _space(text, colon + 1))
        pos = _space(text, pos)
        if text.startswith("}", pos):
            return out, pos + 1
        if not text.startswith(",", pos):
            raise _Syntax("expected , or }")
        pos = _space(text, pos + 1)


def _list(text: str, pos: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    pos = _space(text, pos)
    if text.startswith("]", pos):
        return out, pos + 1
    while True:
        value, pos = gemma4_value(text, pos)
        out.append(value)
        pos = _space(text, pos)
        if text.startswith("]", pos):
            return out, pos + 1
        if not text.startswith(",", pos):
            raise _Syntax("expected , or ]")
        pos = _space(text, pos + 1)


class Gemma4Parser:
    """Parse one Gemma 4 reply. `reasoning`: thoughts go to reasoning (else they stay in the content with
    their tags); `tools`: tool calls are extracted."""

    def __init__(self, reasoning: bool, tools: bool) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self._ids: list[str] = []

    def parse(self, text: str, final: bool) -> Parsed:
        out = Parsed()
        pos = len(TURN) if text.startswith(TURN) else 0
        stops = (CHANNEL_OPEN, CHANNEL_CLOSE, CALL_OPEN) if self.tools else (CHANNEL_OPEN, CHANNEL_CLOSE)
        while pos >= 0:
            pos = self._message(text, pos, final, stops, out)
        keep_ids(self._ids, out.tool_calls)
        return out

    def _message(self, text: str, pos: int, final: bool, stops: tuple[str, ...], out: Parsed) -> int:
        """Read one thought and the content after it; the position of the next, or -1 at the end."""
        while text.startswith(CHANNEL_OPEN, pos) and not text.startswith(THOUGHT, pos):
            if not final and THOUGHT.startswith(text[pos:]):
                return -1  # a thought's opening, cut off
            pos += len(CHANNEL_OPEN)  # an empty channel token before the thought
        if text.startswith(THOUGHT, pos):
            pos = self._thought(text, pos, final, out)
            if pos < 0:
                return -1
        nxt = min((i for i in (text.find(s, pos) for s in stops) if i >= 0), default=-1)
        if nxt < 0:
            rest = text[pos:]
            out.content += rest if final else rest[: len(rest) - held_prefix(rest, stops)]
            return -1
        out.content += text[pos:nxt]
        if text.startswith(CHANNEL_CLOSE, nxt):
            # a stray end of channel ends the message; with tools, llama.cpp scans on to the first call
            nxt = text.find(CALL_OPEN, nxt) if self.tools else -1
            if nxt < 0:
                return -1
        if text.startswith(CALL_OPEN, nxt):
            self._calls(text, nxt, final, out)
            return -1
        return nxt if nxt < len(text) else -1

    def _thought(self, text: str, pos: int, final: bool, out: Parsed) -> int:
        """Read the thought at `pos`; the position after it, or -1 while it is still open."""
        body_start = _space(text, pos + len(THOUGHT))
        end = text.find(CHANNEL_CLOSE, body_start)
        body = text[body_start:] if end < 0 else text[body_start:end]
        if end < 0 and not final:
            body = body[: len(body) - held_prefix(body, (CHANNEL_CLOSE,))]
        if self.reasoning:
            out.reasoning += body
        else:
            out.content += text[pos:body_start] + body + (CHANNEL_CLOSE if end >= 0 else "")
        return -1 if end < 0 else end + len(CHANNEL_CLOSE)

    def _calls(self, text: str, pos: int, final: bool, out: Parsed) -> None:
        while text.startswith(CALL_OPEN, pos):
            brace = text.find("{", pos)
            close = text.find(CALL_CLOSE, pos)
            if brace < 0 or (close < 0 and not final):
                return
            name = text[pos + len(CALL_OPEN) : brace].strip()
            try:
                args, end = _dict(text, brace + 1)
            except ValueError:
                if close < 0:
                    return
                raw = text[brace:close]  # not Gemma's syntax: passed on as written
                out.tool_calls.append(ToolCall(name, raw))
                pos = close + len(CALL_CLOSE)
                continue
            out.tool_calls.append(ToolCall(name, json.dumps(args, ensure_ascii=False)))
            end = _space(text, end)
            pos = end + len(CALL_CLOSE) if text.startswith(CALL_CLOSE, end) else len(text)
