"""Anthropic Messages API responses: the `message` body and its named stream events (endpoints.md §7)."""

from __future__ import annotations

import json
from typing import Any

from msgspec import UNSET, Struct, UnsetType

from llama_engine import FinalEvent, StopReason, TokenEvent
from llama_engine.tokenizer import Tokenizer

from ..chat_parser import Diff, Parsed
from ..generation import Choice, ErrorObject
from ..sse import named_event
from ..streaming import Formatter
from .chat import Parsing

__all__ = ["AnthropicFormatter", "Message"]


class _Tagged(Struct, tag_field="type", gc=False):
    """`type` first, then the fields: the event's (or block's) name is its tag."""


class ThinkingBlock(_Tagged, tag="thinking"):
    thinking: str
    signature: str | UnsetType = UNSET  # "" in a message; absent when a stream starts the block


class TextBlock(_Tagged, tag="text"):
    text: str


class ToolUseBlock(_Tagged, tag="tool_use"):
    id: str
    name: str
    input: Any


Block = ThinkingBlock | TextBlock | ToolUseBlock


class AnthropicUsage(Struct, gc=False):
    cache_read_input_tokens: int
    input_tokens: int
    output_tokens: int


class Message(Struct, gc=False):
    id: str
    type: str
    role: str
    content: list[Block]
    model: str
    stop_reason: str | None
    stop_sequence: str | None
    usage: AnthropicUsage


class MessageStart(_Tagged, tag="message_start"):
    message: Message


class ContentBlockStart(_Tagged, tag="content_block_start"):
    index: int
    content_block: Block


class ThinkingDelta(_Tagged, tag="thinking_delta"):
    thinking: str


class TextDelta(_Tagged, tag="text_delta"):
    text: str


class InputJsonDelta(_Tagged, tag="input_json_delta"):
    partial_json: str


class SignatureDelta(_Tagged, tag="signature_delta"):
    signature: str


class ContentBlockDelta(_Tagged, tag="content_block_delta"):
    index: int
    delta: ThinkingDelta | TextDelta | InputJsonDelta | SignatureDelta


class ContentBlockStop(_Tagged, tag="content_block_stop"):
    index: int


class StopInfo(Struct, gc=False):
    stop_reason: str
    stop_sequence: str | None


class OutputUsage(Struct, gc=False):
    output_tokens: int


class MessageDelta(_Tagged, tag="message_delta"):
    delta: StopInfo
    usage: OutputUsage


class MessageStop(_Tagged, tag="message_stop"):
    pass


def _stop_reason(final: FinalEvent, tools: bool) -> str:
    if final.reason == StopReason.LENGTH:
        return "max_tokens"
    return "tool_use" if tools else "end_turn"


def _tool_input(arguments: str) -> Any:
    """A tool call's arguments as an object (unparsable ones become `{}`)."""
    try:
        v = json.loads(arguments)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def _blocks(p: Parsed) -> list[Block]:
    out: list[Block] = []
    if p.reasoning:
        out.append(ThinkingBlock(p.reasoning, ""))
    if p.content:
        out.append(TextBlock(p.content))
    out += [ToolUseBlock(c.id, c.name, _tool_input(c.arguments)) for c in p.tool_calls]
    return out


class AnthropicFormatter(Formatter):
    """One choice (the Messages API has no `n`). Blocks are numbered as they open: thinking, text, tool
    uses; a block closes when another opens (a thinking block with an empty signature first)."""

    named = True

    def __init__(self, tok: Tokenizer, parsing: Parsing, *, id: str, model: str, n_prompt: int) -> None:
        super().__init__(tok)
        self.parsing = parsing
        self.stream = parsing.stream()
        self.id, self.model, self.n_prompt = id, model, n_prompt
        self.started = False
        self.index = -1
        self.open: str | None = None  # the kind of the block being streamed

    def _message(
        self, content: list[Block], stop: str | None, seq: str | None, usage: AnthropicUsage
    ) -> Message:
        return Message(self.id, "message", "assistant", content, self.model, stop, seq, usage)

    def _start(self) -> list[Struct]:
        if self.started:
            return []
        self.started = True
        return [MessageStart(self._message([], None, None, AnthropicUsage(0, self.n_prompt, 0)))]

    def token(self, index: int, ev: TokenEvent) -> list[Struct]:
        return self._start() + self._emit(self.stream.feed(ev.text, final=False))

    def final(self, index: int, ev: FinalEvent) -> list[Struct]:
        d = self.stream.feed(ev.text, final=True)
        out = self._start() + self._emit(d) + self._close()
        stop = StopInfo(_stop_reason(ev, bool(d.parsed.tool_calls)), ev.stop_word or None)
        return [*out, MessageDelta(stop, OutputUsage(ev.usage.completion_tokens)), MessageStop()]

    def error(self, err: ErrorObject) -> bytes:
        return named_event("error", err)  # the error object itself, not wrapped

    def _open(self, kind: str, block: Block) -> list[Struct]:
        if self.open == kind:
            return []
        out = self._close()
        self.index += 1
        self.open = kind
        return [*out, ContentBlockStart(self.index, block)]

    def _close(self) -> list[Struct]:
        out: list[Struct] = []
        if self.open == "thinking":
            out.append(ContentBlockDelta(self.index, SignatureDelta("")))
        if self.open is not None:
            out.append(ContentBlockStop(self.index))
        self.open = None
        return out

    def _emit(self, d: Diff) -> list[Struct]:
        out: list[Struct] = []
        if d.reasoning:
            out += self._open("thinking", ThinkingBlock(""))
            out.append(ContentBlockDelta(self.index, ThinkingDelta(d.reasoning)))
        if d.content:
            out += self._open("text", TextBlock(""))
            out.append(ContentBlockDelta(self.index, TextDelta(d.content)))
        for call in d.calls:
            out += self._close()
            self.index += 1
            out.append(ContentBlockStart(self.index, ToolUseBlock(call.id, call.name, {})))
            out.append(ContentBlockDelta(self.index, InputJsonDelta(call.arguments)))
            out.append(ContentBlockStop(self.index))
        return out

    def result(self, choices: list[Choice]) -> Message:
        c = choices[0]
        f = c.final
        assert f is not None
        p = self.parsing.parse(c.text)
        u = f.usage
        usage = AnthropicUsage(u.cached_tokens, u.prompt_tokens - u.cached_tokens, u.completion_tokens)
        return self._message(_blocks(p), _stop_reason(f, bool(p.tool_calls)), f.stop_word or None, usage)
