"""POST /v1/responses (and /responses): the OpenAI Responses API, converted to a chat body (endpoints.md §6)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, post

from llama_engine import FinalEvent, StopReason, TokenEvent

from ..bridge import until_disconnect
from ..chat_parser import Parsed
from ..chat_prompt import ChatBody, build_chat_prompt
from ..errors import ApiError
from ..generation import collect, random_id
from ..sse import PING, event, named_event, sse_response
from ._common import json_response, now, read_body, server_state
from .chat import start_chat

__all__ = ["ResponsesController"]

_PASSED_THROUGH = ("temperature", "top_p", "top_k", "stop", "stream", "seed", "tool_choice", "parallel_tool_calls",
                   "chat_template_kwargs", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty")  # fmt: skip


class ResponsesBody(msgspec.Struct, kw_only=True):
    input: str | Annotated[list[Any], msgspec.Meta(max_length=4096)] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: Annotated[list[Any], msgspec.Meta(max_length=512)] | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=-1, le=2**31 - 1)] | None = None
    reasoning: dict[str, Any] | None = None


def _parts_text(content: Any, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ApiError("'content' must be a string or an array of parts")
    out: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            raise ApiError("content parts must be objects")
        kind = part.get("type")
        if kind in kinds:
            out.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "input_image":
            if "image_url" not in part:
                raise ApiError("'image_url' is required for input_image parts")
            out.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise ApiError(f"unsupported content part type: {kind}")
    return out


def _convert_items(items: list[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            raise ApiError("Cannot determine type of 'item'")
        role, kind = item.get("role"), item.get("type")
        if role in ("user", "system", "developer") and "content" in item:
            messages.append({"role": "system" if role == "developer" else role,
                             "content": _parts_text(item["content"], ("input_text",))})  # fmt: skip
        elif role == "assistant" and "content" in item:
            parts = _parts_text(item["content"], ("output_text", "input_text", "refusal"))
            if (
                messages
                and messages[-1]["role"] == "assistant"
                and isinstance(messages[-1].get("content"), list)
            ):
                messages[-1]["content"] += parts
            else:
                messages.append({"role": "assistant", "content": parts})
        elif kind == "function_call":
            call = {"type": "function", "id": str(item.get("call_id", "")),
                    "function": {"name": str(item.get("name", "")), "arguments": str(item.get("arguments", ""))}}  # fmt: skip
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out = item.get("output", "")
            text = (
                out
                if isinstance(out, str)
                else "".join(p.get("text", "") for p in out if isinstance(p, dict))
            )
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text})
        elif kind == "reasoning":
            content = item.get("content") or []
            text = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            messages.append(
                {"role": "assistant", "content": None, "reasoning_content": text, "tool_calls": []}
            )
        else:
            raise ApiError("Cannot determine type of 'item'")
    return messages


def to_chat(body: ResponsesBody, raw: dict[str, Any]) -> ChatBody:
    if body.input is None:
        raise ApiError("'input' is required")
    if body.previous_response_id:
        raise ApiError("llama.cpp does not support 'previous_response_id'.")
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
    else:
        messages += _convert_items(body.input)
    chat: dict[str, Any] = {k: raw[k] for k in _PASSED_THROUGH if raw.get(k) is not None}
    chat["messages"] = messages
    if body.tools:
        tools = []
        for t in body.tools:
            if isinstance(t, dict) and t.get("type") == "function":
                fn = {k: v for k, v in t.items() if k != "type"}
                fn.setdefault("strict", True)
                tools.append({"type": "function", "function": fn})
        chat["tools"] = tools or None
    if body.max_output_tokens is not None:
        chat["max_tokens"] = body.max_output_tokens
    if body.reasoning and isinstance(body.reasoning.get("effort"), str):
        chat["reasoning_effort"] = body.reasoning["effort"]
    try:
        return msgspec.convert({k: v for k, v in chat.items() if v is not None}, ChatBody)
    except msgspec.ValidationError as e:
        raise ApiError(f"Invalid request: {e}") from e


def _output(p: Parsed, ids: dict[str, str], done: bool = True) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if p.reasoning:
        out.append({"id": ids["rs"], "summary": [], "type": "reasoning",
                    "content": [{"text": p.reasoning, "type": "reasoning_text"}], "encrypted_content": "",
                    "status": "completed"})  # fmt: skip
    if p.content or not (p.reasoning or p.tool_calls):
        out.append({"content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": p.content}],
                    "id": ids["msg"], "role": "assistant", "status": "completed", "type": "message"})  # fmt: skip
    for c in p.tool_calls:
        out.append({"id": f"fc_{c.id}", "type": "function_call", "status": "completed", "arguments": c.arguments,
                    "call_id": f"call_{c.id}", "name": c.name})  # fmt: skip
    return out


class ResponsesController(Controller):
    @post(["/v1/responses", "/responses"], status_code=200)
    async def responses(self, request: Request) -> Response:
        raw_bytes = await request.body()
        body: ResponsesBody = await read_body(request, ResponsesBody)
        raw = msgspec.json.decode(raw_bytes)
        chat = await start_chat(request, to_chat(body, raw if isinstance(raw, dict) else {}))
        st, run = chat.st, chat.run
        ids = {"resp": "resp_" + random_id(), "rs": "rs_" + random_id(), "msg": "msg_" + random_id()}
        created = now()

        def usage(f: Any) -> dict[str, Any]:
            u = f.usage
            return {"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens,
                    "total_tokens": u.prompt_tokens + u.completion_tokens,
                    "input_tokens_details": {"cached_tokens": u.cached_tokens}}  # fmt: skip

        if not chat.body.stream:
            c = (await until_disconnect(request.receive, collect(run, chat.tok, 0, False), run))[0]
            assert c.final is not None
            if c.final.reason == StopReason.ERROR:
                raise ApiError(c.final.error, "server_error")
            p = chat.parser().parse(c.text, final=True)
            return json_response(
                {
                    "completed_at": now(),
                    "created_at": created,
                    "id": ids["resp"],
                    "model": st.model_name,
                    "object": "response",
                    "output": _output(p, ids),
                    "status": "completed",
                    "usage": usage(c.final),
                }
            )

        async def stream() -> AsyncIterator[bytes]:
            def ev(name: str, data: dict[str, Any]) -> bytes:
                return named_event(name, {"type": name, **data})

            head = {"id": ids["resp"], "object": "response", "status": "in_progress"}
            yield ev("response.created", {"response": head})
            yield ev("response.in_progress", {"response": head})
            parser = chat.parser()
            text, prev = "", Parsed()
            opened: set[str] = set()
            try:
                async for item in run.events(30.0):
                    if item is None:
                        yield PING
                        continue
                    _, e = item
                    text += e.text
                    final = not isinstance(e, TokenEvent)
                    if (
                        isinstance(e, FinalEvent) and e.reason == StopReason.ERROR
                    ):  # OAI form, as the reference
                        yield event({"error": {"code": 500, "message": e.error, "type": "server_error"}})
                        return
                    new = parser.parse(text, final=final)
                    if len(new.reasoning) > len(prev.reasoning):
                        if "rs" not in opened:
                            opened.add("rs")
                            yield ev("response.output_item.added", {"item": {
                                "id": ids["rs"], "summary": [], "type": "reasoning", "content": [],
                                "encrypted_content": "", "status": "in_progress"}})  # fmt: skip
                        yield ev("response.reasoning_text.delta",
                                 {"delta": new.reasoning[len(prev.reasoning) :], "item_id": ids["rs"]})  # fmt: skip
                    if len(new.content) > len(prev.content):
                        if "msg" not in opened:
                            opened.add("msg")
                            yield ev("response.output_item.added", {"item": {
                                "content": [], "id": ids["msg"], "role": "assistant", "status": "in_progress",
                                "type": "message"}})  # fmt: skip
                            yield ev("response.content_part.added",
                                     {"item_id": ids["msg"], "part": {"type": "output_text", "text": ""}})  # fmt: skip
                        yield ev("response.output_text.delta",
                                 {"item_id": ids["msg"], "delta": new.content[len(prev.content) :]})  # fmt: skip
                    for c in new.tool_calls[len(prev.tool_calls) :]:
                        item_ = {"id": f"fc_{c.id}", "arguments": "", "call_id": f"call_{c.id}", "name": c.name,
                                 "type": "function_call", "status": "in_progress"}  # fmt: skip
                        yield ev("response.output_item.added", {"item": item_})
                        yield ev(
                            "response.function_call_arguments.delta",
                            {"delta": c.arguments, "item_id": f"fc_{c.id}"},
                        )
                        yield ev("response.output_item.done", {"item": {**item_, "arguments": c.arguments,
                                                                         "status": "completed"}})  # fmt: skip
                    prev = new
                    if final:
                        output = _output(new, ids)
                        if "rs" in opened:
                            rs = {k: v for k, v in output[0].items() if k != "status"}
                            yield ev("response.output_item.done", {"item": rs})
                        if "msg" in opened:
                            msg = next(o for o in output if o["type"] == "message")
                            yield ev(
                                "response.output_text.done", {"item_id": ids["msg"], "text": new.content}
                            )
                            yield ev(
                                "response.content_part.done",
                                {"item_id": ids["msg"], "part": msg["content"][0]},
                            )
                            yield ev("response.output_item.done", {"item": msg})
                        yield ev("response.completed", {"response": {
                            "id": ids["resp"], "object": "response", "created_at": created, "status": "completed",
                            "model": st.model_name, "output": output, "usage": usage(e)}})  # fmt: skip
            finally:
                run.cancel()

        await run.check_first(request.receive)
        return sse_response(stream())

    @post(["/v1/responses/input_tokens", "/responses/input_tokens"], status_code=200)
    async def input_tokens(self, request: Request) -> Response:
        raw_bytes = await request.body()
        body: ResponsesBody = await read_body(request, ResponsesBody)
        raw = msgspec.json.decode(raw_bytes)
        prompt = build_chat_prompt(server_state(request), to_chat(body, raw if isinstance(raw, dict) else {}))
        return json_response({"input_tokens": len(prompt.tokens), "object": "response.input_tokens"})
