"""Splitting generated chat text into reasoning, content and tool calls.

Like llama.cpp, the parser is stateless over the whole text: every streamed piece is appended and the
whole text re-parsed; the stream sends the difference between successive parses. While generation runs,
a tail that may be the start of a tag (`<thi`, `<tool_c`) is held back.

`ParsedStream` keeps one choice's text and last parse and returns each step's `Diff`; every chat-shaped
API (OpenAI chat, Anthropic, Responses) formats the same diffs.

Tool-call formats: hermes/qwen `<tool_call>{json}</tool_call>`, mistral `[TOOL_CALLS][{...}]`, and llama3
JSON (the whole reply is `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from .generation import random_id

__all__ = [
    "ChatParser",
    "Diff",
    "OutputParser",
    "Parsed",
    "ParsedStream",
    "ToolCall",
    "held_prefix",
    "keep_ids",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_TAG = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # always a JSON string
    id: str = field(default_factory=random_id)


@dataclass(slots=True)
class Parsed:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


def held_prefix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `tags`."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:k]):
                best = k
                break
    return best


def keep_ids(ids: list[str], calls: list[ToolCall]) -> None:
    """Give re-parsed calls the ids their earlier parses got (`ids` grows with new calls)."""
    for i, call in enumerate(calls):
        if i < len(ids):
            call.id = ids[i]
        else:
            ids.append(call.id)


class OutputParser(Protocol):
    """What every format's parser does: split the whole text so far (`final`: generation has ended)."""

    def parse(self, text: str, final: bool) -> Parsed: ...


def _call(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


class ChatParser:
    """Parse one request's output. `reasoning`: split thinking blocks (`<think>` or the template's own
    tags); `tools`: extract tool calls. `forced_open`: the prompt opened the block, so the output starts
    as reasoning up to the closing tag (DeepSeek R1 distills, QwQ). `legacy` (deepseek-legacy): the
    thinking text is also kept, with its tags, in the content."""

    def __init__(
        self,
        reasoning: bool,
        tools: bool,
        forced_open: bool = False,
        legacy: bool = False,
        tags: tuple[str, str] = (THINK_OPEN, THINK_CLOSE),
    ) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self.forced_open = forced_open
        self.legacy = legacy
        self.open, self.close = tags
        self._ids: list[str] = []  # tool-call ids stay the same across re-parses

    def parse(self, text: str, final: bool) -> Parsed:
        out = Parsed()
        rest = text
        if self.reasoning:
            stripped = rest.lstrip()
            opened = stripped.startswith(self.open)
            if opened or self.forced_open:
                body = stripped[len(self.open) :] if opened else rest
                end = body.find(self.close)
                if end < 0:
                    hold = 0 if final else held_prefix(body, (self.close,))
                    out.reasoning = body[: len(body) - hold]
                    if self.legacy:
                        out.content = text[: len(text) - hold]
                    return out
                out.reasoning = body[:end]
                rest = body[end + len(self.close) :].lstrip("\n")
                if self.legacy:
                    rest = text[: len(text) - len(rest)] + rest
            elif not final and self.open.startswith(stripped) and stripped:
                return out
        if self.tools:
            rest = self._tools(rest, final, out)
        elif not final and self.reasoning and not out.reasoning:
            rest = rest[: len(rest) - held_prefix(rest, (self.open,))]
        out.content = rest
        keep_ids(self._ids, out.tool_calls)
        return out

    def _tools(self, text: str, final: bool, out: Parsed) -> str:
        start = text.find(TOOL_OPEN)
        if start >= 0:
            content = text[:start]
            for m in re.finditer(
                re.escape(TOOL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CLOSE) + "|$)", text[start:], re.S
            ):
                closed = m.group(0).endswith(TOOL_CLOSE)
                if not closed and not final:
                    break
                try:
                    call = _call(json.loads(m.group(1)))
                except ValueError:
                    call = None
                if call is None:
                    return text if final else content
                out.tool_calls.append(call)
            return content
        lead = text.lstrip()
        for tag in (MISTRAL_TAG, PYTHON_TAG):
            if lead.startswith(tag):
                lead = lead[len(tag) :].lstrip()
                if not final:
                    return ""
                try:
                    obj = json.loads(lead)
                except ValueError:
                    return text
                calls = [_call(o) for o in (obj if isinstance(obj, list) else [obj])]
                if all(calls):
                    out.tool_calls.extend(c for c in calls if c)
                    return ""
                return text
        if lead.startswith("{"):
            if not final:
                return ""
            try:
                call = _call(json.loads(lead))
            except ValueError:
                call = None
            if call is not None:
                out.tool_calls.append(call)
                return ""
            return text
        if not final:
            hold = held_prefix(text, (TOOL_OPEN, MISTRAL_TAG, PYTHON_TAG))
            return text[: len(text) - hold]
        return text


@dataclass(slots=True)
class Diff:
    """What one step added: the new reasoning and content text, the new tool calls (`first_call` is the
    index of `calls[0]` among all calls), and the whole parse so far."""

    reasoning: str
    content: str
    calls: list[ToolCall]
    first_call: int
    parsed: Parsed

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


class ParsedStream:
    """One choice's generated text, re-parsed whole as pieces arrive (as llama.cpp does)."""

    __slots__ = ("last", "parser", "text")

    def __init__(
        self, reasoning: bool, tools: bool, parser: OutputParser | None = None, **options: Any
    ) -> None:
        self.parser = parser or ChatParser(reasoning, tools, **options)
        self.text = ""
        self.last = Parsed()

    def feed(self, piece: str, final: bool) -> Diff:
        self.text += piece
        new = self.parser.parse(self.text, final=final)
        prev, self.last = self.last, new
        n_calls = len(prev.tool_calls)
        return Diff(
            new.reasoning[len(prev.reasoning) :],
            new.content[len(prev.content) :],
            new.tool_calls[n_calls:],
            n_calls,
            new,
        )
