"""POST /v1/messages (Anthropic Messages API, streaming and not) and /v1/messages/count_tokens.

The body is converted to a chat-completions body (endpoints.md §7), then served like §5.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, post

from llama_engine import FinalEvent, StopReason, TokenEvent

from ..bridge import until_disconnect
from ..chat_parser import Parsed
from ..chat_prompt import ChatBody, build_chat_prompt
from ..errors import ApiError
from ..generation import collect
from ..params import Float, Int32, NPredict, Stop
from ..sse import PING, named_event, sse_response
from ._common import json_response, read_body, server_state
from .chat import start_chat

__all__ = ["AnthropicController"]


class AnthropicBody(msgspec.Struct, kw_only=True):
    messages: Annotated[list[Any], msgspec.Meta(max_length=4096)] | None = None
    system: str | Annotated[list[Any], msgspec.Meta(max_length=256)] | None = None
    model: str | None = None
    max_tokens: NPredict | None = None
    stop_sequences: Annotated[list[Stop], msgspec.Meta(max_length=64)] | None = None
    temperature: Float | None = None
    top_p: Float | None = None
    top_k: Int32 | None = None
    stream: bool | None = None
    tools: Annotated[list[Any], msgspec.Meta(max_length=512)] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def _blocks_text(blocks: list[Any]) -> str:
    return "".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")


def _convert_message(m: Any) -> list[dict[str, Any]]:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise ApiError("each message must be an object with a 'role'")
    role, content = m["role"], m.get("content")
    if isinstance(content, str) or content is None:
        if role == "assistant" and content is None:
            return []
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ApiError("message content must be a string or an array of blocks")
    parts: list[dict[str, Any]] = []
    reasoning, tool_calls, tool_msgs = "", [], []
    for b in content:
        if not isinstance(b, dict):
            raise ApiError("content blocks must be objects")
        kind = b.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": str(b.get("text", ""))})
        elif kind == "thinking":
            reasoning += str(b.get("thinking", ""))
        elif kind == "image":
            src = b.get("source") or {}
            url = (f"data:{src.get('media_type') or 'image/jpeg'};base64,{src.get('data', '')}"
                   if src.get("type") == "base64" else src.get("url", ""))  # fmt: skip
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "tool_use":
            tool_calls.append({"type": "function", "id": str(b.get("id", "")),
                               "function": {"name": str(b.get("name", "")),
                                            "arguments": json.dumps(b.get("input", {}))}})  # fmt: skip
        elif kind == "tool_result":
            c = b.get("content")
            text = c if isinstance(c, str) else _blocks_text(c) if isinstance(c, list) else ""
            tool_msgs.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")), "content": text})
    msg: dict[str, Any] = {"role": role, "content": parts}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if tool_calls:
        msg["tool_calls"] = tool_calls
    out = [msg] if (parts or tool_calls or role != "assistant") else []
    return out + tool_msgs


def to_chat(body: AnthropicBody) -> ChatBody:
    if body.messages is None:
        raise ApiError("'messages' is required", "server_error")
    messages: list[dict[str, Any]] = []
    if body.system:
        system = body.system if isinstance(body.system, str) else _blocks_text(body.system)
        messages.append({"role": "system", "content": system})
    for m in body.messages:
        messages.extend(_convert_message(m))
    tools = None
    if body.tools:
        tools = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                                   "parameters": t.get("input_schema", {})}}
                 for t in body.tools if isinstance(t, dict)]  # fmt: skip
    choice = None
    if body.tool_choice:
        choice = "auto" if body.tool_choice.get("type") == "auto" else "required"
    chat = {
        "messages": messages, "max_tokens": body.max_tokens if body.max_tokens is not None else 4096,
        "stop": body.stop_sequences, "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
        "stream": body.stream, "tools": tools, "tool_choice": choice, "chat_template_kwargs": body.chat_template_kwargs,
    }  # fmt: skip
    try:
        return msgspec.convert({k: v for k, v in chat.items() if v is not None}, ChatBody)
    except msgspec.ValidationError as e:
        raise ApiError(f"Invalid request: {e}") from e


def _stop_reason(final: FinalEvent, tools: bool) -> str:
    if final.reason == StopReason.LENGTH:
        return "max_tokens"
    return "tool_use" if tools else "end_turn"


def _tool_input(arguments: str) -> Any:
    try:
        v = json.loads(arguments)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


class AnthropicController(Controller):
    @post("/v1/messages", status_code=200)
    async def messages(self, request: Request) -> Response:
        body: AnthropicBody = await read_body(request, AnthropicBody)
        chat = await start_chat(request, to_chat(body))
        st, run = chat.st, chat.run
        if not body.stream:
            choices = await until_disconnect(request.receive, collect(run, chat.tok, 0, False), run)
            c = choices[0]
            assert c.final is not None
            if c.final.reason == StopReason.ERROR:
                raise ApiError(c.final.error, "server_error")
            p = chat.parser().parse(c.text, final=True)
            content: list[dict[str, Any]] = []
            if p.reasoning:
                content.append({"type": "thinking", "thinking": p.reasoning, "signature": ""})
            if p.content:
                content.append({"type": "text", "text": p.content})
            for call in p.tool_calls:
                content.append(
                    {
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name,
                        "input": _tool_input(call.arguments),
                    }
                )
            u = c.final.usage
            return json_response(
                {
                    "id": chat.id,
                    "type": "message",
                    "role": "assistant",
                    "content": content,
                    "model": st.model_name,
                    "stop_reason": _stop_reason(c.final, bool(p.tool_calls)),
                    "stop_sequence": c.final.stop_word or None,
                    "usage": {
                        "cache_read_input_tokens": u.cached_tokens,
                        "input_tokens": u.prompt_tokens - u.cached_tokens,
                        "output_tokens": u.completion_tokens,
                    },
                }
            )

        async def stream() -> AsyncIterator[bytes]:
            parser = chat.parser()
            text, prev = "", Parsed()
            started = False
            index = -1
            open_kind: str | None = None

            def ev(name: str, data: dict[str, Any]) -> bytes:
                return named_event(name, {"type": name, **data})

            def close() -> list[bytes]:
                nonlocal open_kind
                out = []
                if open_kind == "thinking":
                    out.append(
                        ev(
                            "content_block_delta",
                            {"index": index, "delta": {"type": "signature_delta", "signature": ""}},
                        )
                    )
                if open_kind is not None:
                    out.append(ev("content_block_stop", {"index": index}))
                open_kind = None
                return out

            def emit(new: Parsed) -> list[bytes]:
                nonlocal index, open_kind
                out: list[bytes] = []
                if len(new.reasoning) > len(prev.reasoning):
                    if open_kind != "thinking":
                        out += close()
                        index += 1
                        open_kind = "thinking"
                        out.append(
                            ev(
                                "content_block_start",
                                {"index": index, "content_block": {"type": "thinking", "thinking": ""}},
                            )
                        )
                    out.append(ev("content_block_delta", {"index": index, "delta": {"type": "thinking_delta",
                                                                                    "thinking": new.reasoning[len(prev.reasoning):]}}))  # fmt: skip
                if len(new.content) > len(prev.content):
                    if open_kind != "text":
                        out += close()
                        index += 1
                        open_kind = "text"
                        out.append(
                            ev(
                                "content_block_start",
                                {"index": index, "content_block": {"type": "text", "text": ""}},
                            )
                        )
                    out.append(ev("content_block_delta", {"index": index, "delta": {"type": "text_delta",
                                                                                    "text": new.content[len(prev.content):]}}))  # fmt: skip
                for call in new.tool_calls[len(prev.tool_calls) :]:
                    out += close()
                    index += 1
                    out.append(ev("content_block_start", {"index": index, "content_block": {"type": "tool_use", "id": call.id,
                                                                                            "name": call.name, "input": {}}}))  # fmt: skip
                    out.append(ev("content_block_delta", {"index": index, "delta": {"type": "input_json_delta",
                                                                                    "partial_json": call.arguments}}))  # fmt: skip
                    out.append(ev("content_block_stop", {"index": index}))
                return out

            try:
                async for item in run.events(30.0):
                    if item is None:
                        yield PING
                        continue
                    _, e = item
                    if not started:
                        started = True
                        n_prompt = len(chat.prompt.tokens)
                        yield ev("message_start", {"message": {
                            "id": chat.id, "type": "message", "role": "assistant", "content": [], "model": st.model_name,
                            "stop_reason": None, "stop_sequence": None,
                            "usage": {"cache_read_input_tokens": 0, "input_tokens": n_prompt, "output_tokens": 0}}})  # fmt: skip
                    if isinstance(e, TokenEvent):
                        text += e.text
                        new = parser.parse(text, final=False)
                        for b in emit(new):
                            yield b
                        prev = new
                        continue
                    if e.reason == StopReason.ERROR:
                        yield named_event("error", {"code": 500, "message": e.error, "type": "server_error"})
                        return
                    text += e.text
                    new = parser.parse(text, final=True)
                    for b in emit(new):
                        yield b
                    for b in close():
                        yield b
                    yield ev("message_delta", {"delta": {"stop_reason": _stop_reason(e, bool(new.tool_calls)),
                                                         "stop_sequence": e.stop_word or None},
                                               "usage": {"output_tokens": e.usage.completion_tokens}})  # fmt: skip
                    yield ev("message_stop", {})
            finally:
                run.cancel()

        await run.check_first(request.receive)
        return sse_response(stream())

    @post("/v1/messages/count_tokens", status_code=200)
    async def count_tokens(self, request: Request) -> Response:
        body: AnthropicBody = await read_body(request, AnthropicBody)
        prompt = build_chat_prompt(server_state(request), to_chat(body))
        return json_response({"input_tokens": len(prompt.tokens)})
