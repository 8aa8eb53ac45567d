"""Chat requests (OpenAI shape): their validation, and the prompt they render to.

`render_chat` checks the messages on the event loop, then renders the template and tokenizes in the
state's worker pool (templates are untrusted code, bounded in time and output size by `template`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from llama_engine.tokenizer import Tokenizer

from .errors import ApiError
from .prompts import check_request_chars, check_text_size
from .schemas import ChatBody, Message
from .state import ServerState
from .template import ChatTemplate, TemplateError
from .template_caps import TemplateCaps, adapt_messages

__all__ = ["PromptResult", "media_not_supported", "render_chat", "validate_chat"]


class PromptResult(msgspec.Struct):
    text: str  # the rendered template (what /apply-template returns)
    tokens: list[int]
    prefilled: bool
    thinking_open: bool = False  # the prompt ends inside an open thinking block: output starts as reasoning
    think_tags: tuple[str, str] = ("<think>", "</think>")


_MEDIA = {"image_url": "image", "input_audio": "audio", "input_video": "video", "video_url": "video"}


def media_not_supported(part_type: str) -> ApiError:
    """llama.cpp's error for an image, audio or video part given to a model without a projector."""
    return ApiError(
        f"{_MEDIA[part_type]} input is not supported - hint: if this is unexpected, you may need to provide "
        "the mmproj",
        "server_error",
    )


def _content_text(m: Message, sep: str = "\n") -> str | None:
    """The message's text; its text parts joined by `sep` (llama.cpp joins a message's parts with a newline,
    and the parts of an assistant message it continues with a blank line)."""
    if m.content is None or isinstance(m.content, str):
        return m.content
    texts = []
    for part in m.content:
        if part.type == "text":
            if not isinstance(part.text, str):
                raise ApiError("content part of type 'text' needs a 'text' string")
            texts.append(part.text)
        elif part.type in _MEDIA:
            raise media_not_supported(part.type)
        else:
            raise ApiError("unsupported content[].type")
    return sep.join(texts)


def validate_chat(body: ChatBody, jinja: bool) -> list[dict[str, Any]]:
    """The messages as template input, after llama.cpp's checks."""
    if body.messages is None:
        raise ApiError("'messages' is required")
    if body.response_format is not None:
        kind = body.response_format.type
        if kind not in ("text", "json_object", "json_schema"):
            raise ApiError(f'response_format type must be one of "text" or "json_object", but got: {kind}')
    if body.json_schema is not None and body.grammar:
        raise ApiError("Cannot use both json_schema and grammar", "server_error")
    if body.tools and not jinja:
        raise ApiError("tools param requires --jinja flag", "server_error")
    if isinstance(body.tool_choice, str) and body.tool_choice not in ("auto", "none", "required"):
        raise ApiError(f"Invalid tool_choice: {body.tool_choice}")
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError("top_logprobs requires logprobs to be set to true")
    if body.logprobs and body.tools and body.stream:
        raise ApiError("logprobs is not supported with tools + stream")
    kwargs = body.chat_template_kwargs or {}
    if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
        raise ApiError("enable_thinking must be a boolean")
    out = []
    for m in body.messages:
        text = _content_text(m)
        if m.role != "assistant" and text is None:
            raise ApiError("All non-assistant messages must contain 'content'")
        if m.role == "assistant" and text is None and not m.tool_calls:
            raise ApiError("Assistant message must contain either 'content' or 'tool_calls'!")
        d: dict[str, Any] = {"role": m.role, "content": text if text is not None else ""}
        for key in ("tool_calls", "tool_call_id", "name", "reasoning_content"):
            v = getattr(m, key)
            if v is not None:
                d[key] = v
        out.append(d)
    if len(out) >= 2 and out[-1]["role"] == "assistant" and out[-2]["role"] == "assistant":
        raise ApiError("Cannot have 2 or more assistant messages at the end of the list.")
    return out


class _Plan(msgspec.Struct):
    """What rendering needs, decided on the event loop from the request."""

    messages: list[dict[str, Any]]
    add_generation_prompt: bool
    tools: list[Any] | None
    kwargs: dict[str, Any]
    prefill: bool


def _plan(st: ServerState, body: ChatBody) -> _Plan:
    """Validate the request and its size (before any rendering) and settle the template's inputs."""
    engine = st.require_engine()
    messages = validate_chat(body, st.config.jinja)
    n_chars = sum(len(m["content"]) + len(m.get("reasoning_content") or "") for m in messages)
    check_request_chars(n_chars, '"messages"')
    check_text_size(n_chars, engine.tokenizer, engine.n_ctx_slot)
    prefill = bool(messages) and messages[-1]["role"] == "assistant" and st.config.prefill_assistant
    if prefill and body.messages and isinstance(body.messages[-1].content, list):
        messages[-1]["content"] = _content_text(body.messages[-1], "\n\n")
    if prefill and body.add_generation_prompt is True and body.continue_final_message:
        raise ApiError("Cannot set both add_generation_prompt and continue_final_message to true.")
    add_gen = (
        False if prefill else (body.add_generation_prompt if body.add_generation_prompt is not None else True)
    )
    kwargs = {**st.config.chat_template_kwargs, **(body.chat_template_kwargs or {})}
    if body.reasoning_effort is not None:
        if body.reasoning_effort == "none":
            kwargs["enable_thinking"] = False
        else:
            kwargs["reasoning_effort"] = body.reasoning_effort
    # as llama.cpp, every template sees enable_thinking: --reasoning off makes it false, else true
    kwargs.setdefault("enable_thinking", st.config.reasoning != "off")
    kwargs.setdefault("preserve_reasoning", True)  # llama-server's default template variable
    tools = body.tools if body.tool_choice != "none" else None
    return _Plan(messages, add_gen, tools, kwargs, prefill)


def _render(template: ChatTemplate, tok: Tokenizer, plan: _Plan) -> PromptResult:
    """Render the chat template and tokenize: template text with special-token parsing, the messages' text
    without (a user cannot write control tokens)."""
    caps = template.caps
    messages = adapt_messages(plan.messages, caps)
    try:
        segments = template.render_segments(messages, plan.add_generation_prompt, plan.tools, plan.kwargs)
    except TemplateError as e:
        raise ApiError(str(e)) from e
    thinking_open = False
    if plan.add_generation_prompt and caps.think_open and not plan.prefill:
        segments, thinking_open = _thinking_tail(
            segments, caps, plan.kwargs.get("enable_thinking") is not False
        )
    # Gemma 4's template opens no model turn after one that ended in content and tool calls (as
    # llama.cpp, open it, else the model does not start with its thought)
    gemma4 = caps.chat_format == "gemma4" and plan.add_generation_prompt and not plan.prefill
    if gemma4 and "".join(t for t, _ in segments).endswith("<turn|>\n"):
        segments.append(("<|turn>model\n", False))
    if plan.prefill:
        # continue the last assistant message: cut the template text after its content
        last_user = max((i for i, (_, user) in enumerate(segments) if user), default=-1)
        if last_user >= 0 and messages[-1]["content"]:
            segments = segments[: last_user + 1]
    text = "".join(t for t, _ in segments)
    tokens: list[int] = []
    if tok.add_bos and tok.bos_id is not None:
        tokens.append(tok.bos_id)
        bos_text = template.bos_token
        if bos_text and segments and not segments[0][1] and segments[0][0].startswith(bos_text):
            segments[0] = (segments[0][0][len(bos_text) :], False)
    for piece, user in segments:
        tokens.extend(tok.encode(piece, add_special=False, parse_special=not user))
    return PromptResult(text, tokens, plan.prefill, thinking_open, (caps.think_open, caps.think_close))


def _thinking_tail(
    segments: list[tuple[str, bool]], caps: TemplateCaps, enabled: bool
) -> tuple[list[tuple[str, bool]], bool]:
    """Thinking at the end of the prompt, as llama.cpp: a generation prompt that ends in an open block
    (`<think>\n`) starts the reply inside it; with thinking off, that block is closed, and a template
    with thinking tags but no `enable_thinking` switch gets an empty block."""
    text = "".join(t for t, _ in segments)
    ends_open = text.rstrip().endswith(caps.think_open)
    if enabled:
        return segments, ends_open
    if ends_open:
        return [*segments, (caps.think_close, False)], False
    if not caps.thinking_switch:
        return [*segments, (caps.think_open + caps.think_close, False)], False
    return segments, False


async def render_chat(st: ServerState, body: ChatBody) -> PromptResult:
    """The request's prompt: checked on the event loop, rendered and tokenized in the worker pool."""
    plan = _plan(st, body)
    assert st.template is not None
    return await st.offload(_render, st.template, st.require_engine().tokenizer, plan)
