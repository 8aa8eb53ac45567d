"""OpenAI Responses API: the `response` body and its named stream events (endpoints.md §6)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

from llama_engine import FinalEvent, ProgressEvent, StopReason, TokenEvent
from llama_engine.tokenizer import Tokenizer

from ..chat_parser import Diff, Parsed, ToolCall
from ..controllers._common import now
from ..generation import ApiTimings, Choice, random_id, timings_out
from ..streaming import Formatter
from .chat import Parsing
from .progress import PromptProgress, progress_out

__all__ = ["Response", "ResponsesFormatter"]


class ReasoningText(Struct, gc=False):
    text: str
    type: str = "reasoning_text"


class OutputText(Struct, gc=False):
    type: str
    annotations: list[object]
    logprobs: list[object]
    text: str


class PartStub(Struct, gc=False):
    type: str
    text: str


class ReasoningItem(Struct, kw_only=True, gc=False):
    id: str
    summary: list[object]
    type: str = "reasoning"
    content: list[ReasoningText]
    encrypted_content: str = ""
    status: str | UnsetType = UNSET  # absent from the stream's `output_item.done`


class MessageItem(Struct, kw_only=True, gc=False):
    content: list[OutputText]
    id: str
    role: str = "assistant"
    status: str
    type: str = "message"


class FunctionCallItem(Struct, kw_only=True, gc=False):
    id: str
    type: str = "function_call"
    status: str
    arguments: str
    call_id: str
    name: str


Item = ReasoningItem | MessageItem | FunctionCallItem


class TokenUsage(Struct, gc=False):
    cached_tokens: int


class ResponsesUsage(Struct, gc=False):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: TokenUsage

    @classmethod
    def of(cls, f: FinalEvent) -> ResponsesUsage:
        u = f.usage
        total = u.prompt_tokens + u.completion_tokens
        return cls(u.prompt_tokens, u.completion_tokens, total, TokenUsage(u.cached_tokens))


class ConversationRef(Struct, gc=False):
    id: str


class _Stored(Struct, kw_only=True, gc=False):
    """The state fields, shown by a server with a store (llama_server.store) and absent otherwise, as
    llama-server answers."""

    previous_response_id: str | UnsetType | None = UNSET
    conversation: ConversationRef | UnsetType | None = UNSET
    store: bool | UnsetType = UNSET
    instructions: str | UnsetType | None = UNSET


class Response(_Stored, gc=False):
    """The non-streamed body."""

    completed_at: int
    created_at: int
    id: str
    model: str
    object: str
    output: list[Item]
    status: str
    usage: ResponsesUsage


class ResponseHead(Struct, gc=False):
    id: str
    object: str
    status: str


class CompletedResponse(_Stored, gc=False):
    id: str
    object: str
    created_at: int
    status: str
    model: str
    output: list[Item]
    usage: ResponsesUsage


class _Event(Struct, tag_field="type", kw_only=True, gc=False):
    # llama-server: on the last event of a token with timings_per_token, and on response.completed
    timings: ApiTimings | UnsetType = UNSET
    # OpenAI's positions, which its SDK's stream accumulator needs (llama-server sends none): the item's
    # place in `output`, the part's place in the item's `content`, the event's number in the stream
    output_index: int | UnsetType = UNSET
    content_index: int | UnsetType = UNSET
    sequence_number: int | UnsetType = UNSET


class Created(_Event, tag="response.created"):
    response: ResponseHead


class InProgress(_Event, tag="response.in_progress"):
    response: ResponseHead
    prompt_progress: PromptProgress | UnsetType = UNSET  # a return_progress update


class ItemAdded(_Event, tag="response.output_item.added"):
    item: Item


class PartAdded(_Event, tag="response.content_part.added"):
    item_id: str
    part: PartStub


class ReasoningDelta(_Event, tag="response.reasoning_text.delta"):
    delta: str
    item_id: str


class TextDelta(_Event, tag="response.output_text.delta"):
    item_id: str
    delta: str


class ArgumentsDelta(_Event, tag="response.function_call_arguments.delta"):
    delta: str
    item_id: str


class ItemDone(_Event, tag="response.output_item.done"):
    item: Item


class TextDone(_Event, tag="response.output_text.done"):
    item_id: str
    text: str


class PartDone(_Event, tag="response.content_part.done"):
    item_id: str
    part: OutputText


class Completed(_Event, tag="response.completed"):
    response: CompletedResponse


def _call_item(c: ToolCall, status: str, arguments: str) -> FunctionCallItem:
    return FunctionCallItem(
        id=f"fc_{c.id}", status=status, arguments=arguments, call_id=f"call_{c.id}", name=c.name
    )


class ResponsesFormatter(Formatter):
    """One choice. Item ids (`rs_`, `msg_`, `fc_<call id>`) are fixed per response, so `added`, the
    deltas and `done` name the same item."""

    named = True

    def __init__(
        self,
        tok: Tokenizer,
        parsing: Parsing,
        *,
        created: int,
        model: str,
        state: dict[str, Any] | None = None,
        on_complete: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """`state`: the `_Stored` fields to show; `on_complete(body)` is called with the completed response
        (the non-streamed body's shape) before its last event or body is sent (the store keeps it)."""
        super().__init__(tok)
        self.parsing = parsing
        self.stream = parsing.stream()
        self.created, self.model = created, model
        self.id, self.rs, self.msg = "resp_" + random_id(), "rs_" + random_id(), "msg_" + random_id()
        self.opened: set[str] = set()
        self.state = state or {}
        self.on_complete = on_complete
        self.positions: dict[str, int] = {}  # item id -> output_index, in the order items are added
        self.sequence = 0

    def _numbered(self, events: list[_Event]) -> list[_Event]:
        """Each event with its sequence number and, where it concerns an item, OpenAI's indexes."""
        for ev in events:
            ev.sequence_number = self.sequence
            self.sequence += 1
            item_id = ev.item.id if isinstance(ev, ItemAdded | ItemDone) else getattr(ev, "item_id", None)
            if item_id is not None:
                ev.output_index = self.positions.setdefault(item_id, len(self.positions))
                if isinstance(ev, PartAdded | PartDone | TextDelta | TextDone | ReasoningDelta):
                    ev.content_index = 0
        return events

    def _body(self, output: list[Item], usage: ResponsesUsage) -> Response:
        body = Response(
            now(), self.created, self.id, self.model, "response", output, "completed", usage, **self.state
        )
        if self.on_complete is not None:
            self.on_complete(msgspec.to_builtins(body))
        return body

    def _output(self, p: Parsed) -> list[Item]:
        out: list[Item] = []
        if p.reasoning:
            out.append(
                ReasoningItem(
                    id=self.rs, summary=[], content=[ReasoningText(p.reasoning)], status="completed"
                )
            )
        if p.content or not (p.reasoning or p.tool_calls):
            text = OutputText("output_text", [], [], p.content)
            out.append(MessageItem(content=[text], id=self.msg, status="completed"))
        for c in p.tool_calls:
            out.append(_call_item(c, "completed", c.arguments))
        return out

    def opening(self) -> list[_Event]:
        head = ResponseHead(self.id, "response", "in_progress")
        return self._numbered([Created(head), InProgress(head)])

    def progress(self, index: int, ev: ProgressEvent) -> list[_Event]:
        tm = timings_out(ev.timings) if ev.timings is not None else UNSET
        head = ResponseHead(self.id, "response", "in_progress")
        return self._numbered([InProgress(head, progress_out(ev), timings=tm)])

    def token(self, index: int, ev: TokenEvent) -> list[_Event]:
        out = self._emit(self.stream.feed(ev.text, final=False))
        if out and ev.timings is not None:
            out[-1].timings = timings_out(ev.timings)
        return self._numbered(out)

    def final(self, index: int, ev: FinalEvent) -> list[_Event]:
        d = self.stream.feed(ev.text, final=True)
        out = self._emit(d)
        output = self._output(d.parsed)
        for item in output:
            if isinstance(item, ReasoningItem) and "rs" in self.opened:
                out.append(ItemDone(msgspec.structs.replace(item, status=UNSET)))
            elif isinstance(item, MessageItem) and "msg" in self.opened:
                out += [
                    TextDone(self.msg, d.parsed.content),
                    PartDone(self.msg, item.content[0]),
                    ItemDone(item),
                ]
        usage = ResponsesUsage.of(ev)
        if ev.reason != StopReason.CANCELLED:
            self._body(output, usage)
        done = CompletedResponse(
            self.id, "response", self.created, "completed", self.model, output, usage, **self.state
        )
        return self._numbered([*out, Completed(done, timings=timings_out(ev.timings))])

    def _emit(self, d: Diff) -> list[_Event]:
        out: list[_Event] = []
        if d.reasoning:
            if "rs" not in self.opened:
                self.opened.add("rs")
                out.append(ItemAdded(ReasoningItem(id=self.rs, summary=[], content=[], status="in_progress")))
            out.append(ReasoningDelta(d.reasoning, self.rs))
        if d.content:
            if "msg" not in self.opened:
                self.opened.add("msg")
                out.append(ItemAdded(MessageItem(content=[], id=self.msg, status="in_progress")))
                out.append(PartAdded(self.msg, PartStub("output_text", "")))
            out.append(TextDelta(self.msg, d.content))
        for c in d.calls:
            item = _call_item(c, "in_progress", "")
            out += [
                ItemAdded(item),
                ArgumentsDelta(c.arguments, item.id),
                ItemDone(_call_item(c, "completed", c.arguments)),
            ]
        return out

    def result(self, choices: list[Choice]) -> Response:
        c = choices[0]
        assert c.final is not None
        p = self.parsing.parse(c.text)
        return self._body(self._output(p), ResponsesUsage.of(c.final))
