"""POST /v1/responses (and /responses): the OpenAI Responses API, converted to a chat body (endpoints.md §6).

With `--store` (llama_server.store) a response is kept (`store`, true by default as in OpenAI's API) and can
be continued (`previous_response_id`), run in a conversation (`conversation`: its items are the context,
and the new input and output items are appended), read (`GET /v1/responses/{id}`, `/input_items`) and
deleted. Without a store these answer as llama-server does: `previous_response_id` is a 400.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.params import FromPath, FromQuery, JSONBody
from llama_tools.auth import key_scope

from ..chat_prompt import render_chat
from ..errors import ApiError
from ..formats import ResponsesFormatter
from ..formats.responses import ConversationRef
from ..schemas import ChatBody, ResponsesBody
from ..store import Store, normalize_items
from ..streaming import respond
from ..structured import text_format_to_response_format
from ._common import SharedState, json_response, now, unless_disconnected
from .chat import prepare_chat

__all__ = ["ResponsesController", "to_chat"]

# the request keys given to the chat body as they are
_PASSED_THROUGH = (
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stream",
    "seed",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "grammar",
    "json_schema",
    "response_format",
    "return_progress",
    "timings_per_token",
    "cache_prompt",
    "id_slot",
    "priority",
)


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
            content = _parts_text(item["content"], ("input_text",))
            messages.append({"role": "system" if role == "developer" else role, "content": content})
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
            fn = {"name": str(item.get("name", "")), "arguments": str(item.get("arguments", ""))}
            call = {"type": "function", "id": str(item.get("call_id", "")), "function": fn}
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


def to_chat(
    body: ResponsesBody, raw: dict[str, Any], history: list[dict[str, Any]] | None = None
) -> ChatBody:
    """The chat body of a Responses request; `history`: the stored items it continues (None: no store, and
    then `previous_response_id` is refused as llama-server refuses it)."""
    if body.input is None:
        raise ApiError("'input' is required")
    if body.previous_response_id and history is None:
        raise ApiError("llama.cpp does not support 'previous_response_id'.")
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    messages += _convert_items(history or [])
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
    if "text" in raw:
        chat["response_format"] = text_format_to_response_format(raw["text"]) or chat.get("response_format")
    if body.max_output_tokens is not None:
        chat["max_tokens"] = body.max_output_tokens
    if body.reasoning and isinstance(body.reasoning.get("effort"), str):
        chat["reasoning_effort"] = body.reasoning["effort"]
    try:
        return msgspec.convert({k: v for k, v in chat.items() if v is not None}, ChatBody)
    except msgspec.ValidationError as e:
        raise ApiError(f"Invalid request: {e}") from e


class _Stateful:
    """What a request asks of the store: the context it continues, and where its result goes."""

    def __init__(
        self, server: SharedState, request: Request, data: ResponsesBody, raw: dict[str, Any]
    ) -> None:
        self.store: Store | None = server.store
        self.owner = key_scope(server.config.api_keys, request.headers)
        conv = raw.get("conversation")
        if isinstance(conv, dict):
            conv = conv.get("id")
        if conv is not None and (not isinstance(conv, str) or not conv):
            raise ApiError("'conversation' must be a conversation id or an object with its 'id'")
        self.conversation: str | None = conv
        self.previous = data.previous_response_id or None
        if self.conversation and self.store is None:
            raise ApiError("'conversation' needs a server started with --store", "not_supported_error")
        if self.conversation and self.previous:
            raise ApiError(
                "Mutually exclusive parameters: Ensure you are only providing one of: "
                "'previous_response_id' or 'conversation'."
            )
        keep = raw.get("store", True)
        if not isinstance(keep, bool):
            raise ApiError("'store' must be a boolean")
        self.keep = keep and self.store is not None
        self.instructions = data.instructions

    async def history(self) -> list[dict[str, Any]] | None:
        if self.store is None:
            return None
        if self.previous:
            return await asyncio.to_thread(self.store.context, self.owner, self.previous)
        if self.conversation:
            return await asyncio.to_thread(self.store.all_items, self.owner, self.conversation)
        return []

    def fields(self) -> dict[str, Any]:
        """The response's state fields (shown only by a server with a store)."""
        if self.store is None:
            return {}
        return {
            "previous_response_id": self.previous,
            "conversation": ConversationRef(self.conversation) if self.conversation else None,
            "store": self.keep,
            "instructions": self.instructions,
        }


async def _chat_body(
    request: Request, server: SharedState, data: ResponsesBody
) -> tuple[ChatBody, _Stateful, dict[str, Any]]:
    raw = msgspec.json.decode(await request.body())  # every other key passes through to the chat body
    raw = raw if isinstance(raw, dict) else {}
    state = _Stateful(server, request, data, raw)
    return to_chat(data, raw, await state.history()), state, raw


class ResponsesController(Controller):
    @post(["/v1/responses", "/responses"], status_code=200)
    async def responses(
        self, request: Request, server: SharedState, data: JSONBody[ResponsesBody]
    ) -> Response:
        body, state, _ = await _chat_body(request, server, data)
        on_complete = None
        store = state.store
        if store is not None and (state.keep or state.conversation):
            store.check_room(state.owner)
            inputs = normalize_items(data.input)

            def on_complete(done: dict[str, Any]) -> None:
                store.save_response(
                    state.owner, done, inputs, keep=state.keep, conversation=state.conversation
                )

        job = await prepare_chat(request, server, body)
        tok = server.require_engine().tokenizer
        fmt = ResponsesFormatter(
            tok,
            job.parsing,
            created=now(),
            model=server.model_name,
            state=state.fields(),
            on_complete=on_complete,
        )
        return await respond(request, server, job.reqs, fmt, body)

    @post(["/v1/responses/input_tokens", "/responses/input_tokens"], status_code=200)
    async def input_tokens(
        self, request: Request, server: SharedState, data: JSONBody[ResponsesBody]
    ) -> Response:
        body, _, _ = await _chat_body(request, server, data)
        prompt = await unless_disconnected(request, render_chat(server, body))
        return json_response({"input_tokens": len(prompt.tokens), "object": "response.input_tokens"})

    @get(["/v1/responses/{resp_id:str}", "/responses/{resp_id:str}"])
    async def get_response(self, request: Request, server: SharedState, resp_id: FromPath[str]) -> Response:
        store, owner = server.require_store(), key_scope(server.config.api_keys, request.headers)
        return json_response(await asyncio.to_thread(store.get_response, owner, resp_id))

    @delete(["/v1/responses/{resp_id:str}", "/responses/{resp_id:str}"], status_code=200)
    async def delete_response(
        self, request: Request, server: SharedState, resp_id: FromPath[str]
    ) -> Response:
        store, owner = server.require_store(), key_scope(server.config.api_keys, request.headers)
        return json_response(await asyncio.to_thread(store.delete_response, owner, resp_id))

    @get(["/v1/responses/{resp_id:str}/input_items", "/responses/{resp_id:str}/input_items"])
    async def input_items(
        self,
        request: Request,
        server: SharedState,
        resp_id: FromPath[str],
        limit: FromQuery[int] = 20,
        order: FromQuery[str] = "desc",
        after: FromQuery[str | None] = None,
    ) -> Response:
        store, owner = server.require_store(), key_scope(server.config.api_keys, request.headers)
        page = await asyncio.to_thread(store.input_items, owner, resp_id, limit, order, after)
        return json_response(page.body())
