"""POST /v1/messages (Anthropic Messages API, streaming and not) and /v1/messages/count_tokens.

The body is converted to a chat-completions body (endpoints.md §7), then served like §5.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from litestar import Controller, Request, Response, post
from litestar.params import JSONBody

from ..chat_prompt import render_chat
from ..errors import ApiError
from ..formats import AnthropicFormatter
from ..generation import completion_id
from ..schemas import AnthropicBody, ChatBody
from ..streaming import respond
from ._common import SharedState, json_response, unless_disconnected
from .chat import prepare_chat

__all__ = ["AnthropicController", "to_chat"]


def _blocks_text(blocks: list[Any]) -> str:
    return "".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")


def _image_url(src: dict[str, Any]) -> str:
    if src.get("type") == "base64":
        return f"data:{src.get('media_type') or 'image/jpeg'};base64,{src.get('data', '')}"
    return str(src.get("url", ""))


def _tool_result(content: Any) -> str | list[dict[str, Any]]:
    """A tool result's content: its text, or text and image parts when it holds images (a model without a
    projector then answers that image input is not supported, as llama-server, instead of losing them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    images = [b for b in content if isinstance(b, dict) and b.get("type") == "image"]
    if not images:
        return _blocks_text(content)
    parts: list[dict[str, Any]] = []
    for b in content:
        if isinstance(b, dict) and b.get("type") == "text":
            parts.append({"type": "text", "text": str(b.get("text", ""))})
        elif isinstance(b, dict) and b.get("type") == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(b.get("source") or {})}})
    return parts


def _tool(t: dict[str, Any]) -> dict[str, Any]:
    fn = {
        "name": t.get("name"),
        "description": t.get("description", ""),
        "parameters": t.get("input_schema", {}),
    }
    return {"type": "function", "function": fn}


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
            parts.append({"type": "image_url", "image_url": {"url": _image_url(b.get("source") or {})}})
        elif kind == "tool_use":
            fn = {"name": str(b.get("name", "")), "arguments": json.dumps(b.get("input", {}))}
            tool_calls.append({"type": "function", "id": str(b.get("id", "")), "function": fn})
        elif kind == "tool_result":
            tool_id = str(b.get("tool_use_id", ""))
            tool_msgs.append(
                {"role": "tool", "tool_call_id": tool_id, "content": _tool_result(b.get("content"))}
            )
    msg: dict[str, Any] = {"role": role, "content": parts}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if tool_calls:
        msg["tool_calls"] = tool_calls
    # a user turn made only of tool results becomes just those tool messages (an empty user turn after
    # them would count as the last query, and templates drop the reasoning before it)
    out = [msg] if (parts or tool_calls or (role != "assistant" and not tool_msgs)) else []
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
    tools = [_tool(t) for t in body.tools if isinstance(t, dict)] if body.tools else None
    choice = None
    if body.tool_choice:
        choice = "auto" if body.tool_choice.get("type") == "auto" else "required"
    chat = {
        "messages": messages,
        "max_tokens": body.max_tokens if body.max_tokens is not None else 4096,
        "stop": body.stop_sequences,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "stream": body.stream,
        "tools": tools,
        "tool_choice": choice,
        "chat_template_kwargs": body.chat_template_kwargs,
    }
    thinking = body.thinking or {}
    if thinking.get("type") == "enabled":  # llama-server: the budget of the thinking block
        chat["thinking_budget_tokens"] = thinking.get("budget_tokens", 10000)
    try:
        return msgspec.convert({k: v for k, v in chat.items() if v is not None}, ChatBody)
    except msgspec.ValidationError as e:
        raise ApiError(f"Invalid request: {e}") from e


class AnthropicController(Controller):
    @post("/v1/messages", status_code=200)
    async def messages(
        self, request: Request, server: SharedState, data: JSONBody[AnthropicBody]
    ) -> Response:
        body = to_chat(data)
        job = await prepare_chat(request, server, body)
        tok = server.require_engine().tokenizer
        fmt = AnthropicFormatter(
            tok, job.parsing, id=completion_id(), model=server.model_name, n_prompt=job.n_prompt
        )
        return await respond(request, server, job.reqs, fmt, body)

    @post("/v1/messages/count_tokens", status_code=200)
    async def count_tokens(
        self, request: Request, server: SharedState, data: JSONBody[AnthropicBody]
    ) -> Response:
        prompt = await unless_disconnected(request, render_chat(server, to_chat(data)))
        return json_response({"input_tokens": len(prompt.tokens)})
