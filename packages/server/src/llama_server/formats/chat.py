"""OpenAI chat completion responses: `chat.completion` and `chat.completion.chunk` (endpoints.md §5.2-5.3)."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET, Struct, UnsetType, field
from msgspec.structs import replace

from llama_engine import FinalEvent, ProgressEvent, TokenEvent
from llama_engine.tokenizer import Tokenizer

from ..chat_format import make_parser
from ..chat_parser import Diff, OutputParser, Parsed, ParsedStream
from ..generation import (
    ApiTimings,
    ApiUsage,
    Choice,
    LogprobsContent,
    finish_reason,
    timings_out,
    usage_of,
)
from ..sse import DONE
from ..state import BUILD_INFO
from ..streaming import Formatter
from .native import NativeResult
from .progress import PromptProgress, progress_out
from .verbose import Verbose

__all__ = ["ChatCompletion", "ChatCompletionChunk", "ChatFormatter", "Parsing"]


class Parsing(Struct, frozen=True, gc=False):
    """How a chat request's text is split: reasoning blocks to reasoning, tool calls extracted, in the
    output format of the model's template (`chat_format`)."""

    reasoning: bool
    tools: bool
    forced_open: bool = False  # the prompt opened the thinking block (chat_parser.ChatParser)
    legacy: bool = False  # reasoning_format deepseek-legacy
    tags: tuple[str, str] = ("<think>", "</think>")
    format: str = "generic"  # chat_format.ChatFormat
    tool_defs: list[Any] = []  # the request's tools: the XML format types arguments by their schemas

    def _parser(self) -> OutputParser:
        return make_parser(
            self.format,
            self.reasoning,
            self.tool_defs if self.tools else None,
            self.forced_open,
            thinking=bool(self.tags[0]),
            legacy=self.legacy,
            tags=self.tags,
        )

    def stream(self) -> ParsedStream:
        return ParsedStream(self.reasoning, self.tools, parser=self._parser())

    def parse(self, text: str) -> Parsed:
        return self._parser().parse(text, final=True)


class FunctionCall(Struct, gc=False):
    name: str
    arguments: str  # always a JSON string


class ToolCallOut(Struct, gc=False):
    type: str
    function: FunctionCall
    id: str


class ToolCallDelta(Struct, gc=False):
    index: int
    id: str
    type: str
    function: FunctionCall


class ChatMessage(Struct, omit_defaults=True, gc=False):
    role: str
    content: str  # "" (never null) when the model produced only tool calls
    reasoning_content: str = ""
    tool_calls: list[ToolCallOut] = []


class ChatChoice(Struct, gc=False):
    finish_reason: str | None
    index: int
    message: ChatMessage
    logprobs: LogprobsContent | UnsetType = UNSET


class ChatCompletion(Struct, gc=False):
    choices: list[ChatChoice]
    created: int
    model: str
    system_fingerprint: str
    object: str
    usage: ApiUsage
    id: str
    timings: ApiTimings
    verbose: NativeResult | UnsetType = field(default=UNSET, name="__verbose")


class ChatDelta(Struct, gc=False):
    """Only the parts that changed; the first chunk is `{"role": "assistant", "content": null}`."""

    role: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    content: str | UnsetType | None = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChunkChoice(Struct, gc=False):
    finish_reason: str | None
    index: int
    delta: ChatDelta
    logprobs: LogprobsContent | UnsetType = UNSET


class ChatCompletionChunk(Struct, gc=False):
    choices: list[ChunkChoice]
    created: int
    id: str
    model: str
    system_fingerprint: str
    object: str = "chat.completion.chunk"
    usage: ApiUsage | UnsetType = UNSET
    timings: ApiTimings | UnsetType = UNSET
    verbose: NativeResult | UnsetType = field(default=UNSET, name="__verbose")
    prompt_progress: PromptProgress | UnsetType = UNSET  # a return_progress update


def _delta(d: Diff) -> ChatDelta:
    out = ChatDelta()
    if d.reasoning:
        out.reasoning_content = d.reasoning
    if d.content:
        out.content = d.content
    if d.calls:
        out.tool_calls = [
            ToolCallDelta(i, c.id, "function", FunctionCall(c.name, c.arguments))
            for i, c in enumerate(d.calls, start=d.first_call)
        ]
    return out


def _message(p: Parsed) -> ChatMessage:
    calls = [ToolCallOut("function", FunctionCall(c.name, c.arguments), c.id) for c in p.tool_calls]
    return ChatMessage("assistant", p.content, p.reasoning, calls)


class ChatFormatter(Formatter):
    done = DONE

    def __init__(
        self,
        tok: Tokenizer,
        parsing: Parsing,
        n: int,
        *,
        id: str,
        created: int,
        model: str,
        n_probs: int,
        post: bool,
        special: bool = False,
        include_usage: bool,
        verbose: Verbose | None = None,
    ) -> None:
        super().__init__(tok, n_probs, post, special)
        self.verbose = verbose
        self.parsing = parsing
        self.streams = [parsing.stream() for _ in range(n)]
        self.started = [False] * n
        self.finals: list[FinalEvent] = []
        self.id, self.created, self.model = id, created, model
        self.head = ChatCompletionChunk([], created, id, model, BUILD_INFO)  # what every chunk shares
        self.include_usage = include_usage

    def _start(self, i: int) -> list[ChatCompletionChunk]:
        if self.started[i]:
            return []
        self.started[i] = True
        return [replace(self.head, choices=[ChunkChoice(None, i, ChatDelta(role="assistant", content=None))])]

    def progress(self, index: int, ev: ProgressEvent) -> list[ChatCompletionChunk]:
        # as llama-server: every update is a role chunk; the first token still sends its own
        choice = ChunkChoice(None, index, ChatDelta(role="assistant", content=None))
        tm = timings_out(ev.timings) if ev.timings is not None else UNSET
        return [replace(self.head, choices=[choice], timings=tm, prompt_progress=progress_out(ev))]

    def token(self, index: int, ev: TokenEvent) -> list[ChatCompletionChunk]:
        if self.verbose is not None:  # its native result counts tokens and new lines
            self.verbose.chunk(index, ev)
        out = self._start(index)
        d = self.streams[index].feed(ev.text, final=False)
        if d:
            out.append(replace(self.head, choices=[ChunkChoice(None, index, _delta(d))]))
        # as llama-server: a token that changes nothing sends nothing (its logprobs and timings only ride on
        # a chunk this token sent, the last one)
        if out:
            probs = self.probs(ev)
            if probs is not None:
                out[-1].choices[0].logprobs = LogprobsContent([probs])
            if ev.timings is not None:
                out[-1].timings = timings_out(ev.timings)
        return out

    def final(self, index: int, ev: FinalEvent) -> list[ChatCompletionChunk]:
        out = self._start(index)
        d = self.streams[index].feed(ev.text, final=True)
        ending = [replace(self.head, choices=[ChunkChoice(None, index, _delta(d))])] if d else []
        self.finals.append(ev)
        last = ChunkChoice(finish_reason(ev, bool(d.parsed.tool_calls)), index, ChatDelta())
        ending.append(replace(self.head, choices=[last], timings=timings_out(ev.timings)))
        if self.verbose is not None:  # as llama-server: on the first chunk of the final result
            ending[0].verbose = self.verbose.final(index, ev)
        return out + ending

    def closing(self) -> list[ChatCompletionChunk]:
        if not self.include_usage:
            return []
        # as llama-server: the last chunk (the usage one, empty choices) carries the timings too
        tm = timings_out(self.finals[-1].timings) if self.finals else UNSET
        return [replace(self.head, usage=usage_of(self.finals, one_prompt=True), timings=tm)]

    def result(self, choices: list[Choice]) -> ChatCompletion:
        out = []
        for c in choices:
            parsed = self.parsing.parse(c.text)
            choice = ChatChoice(finish_reason(c.final, bool(parsed.tool_calls)), c.index, _message(parsed))
            if self.n_probs:
                choice.logprobs = LogprobsContent(c.probs)
            out.append(choice)
        finals = [c.final for c in choices if c.final is not None]
        usage = usage_of(finals, one_prompt=True)
        body = ChatCompletion(
            out,
            self.created,
            self.model,
            BUILD_INFO,
            "chat.completion",
            usage,
            self.id,
            timings_out(finals[0].timings),
        )
        if self.verbose is not None:
            body.verbose = self.verbose.result(choices[0])
        return body
