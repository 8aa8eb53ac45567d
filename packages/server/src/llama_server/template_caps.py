"""What a chat template can render, found by rendering probe conversations (as llama.cpp does when it loads
one), and the message rewrites that make up for what it cannot.

- No system role (Gemma 2 raises "System role not supported", others drop it): the system text is merged
  into the next message, `system + "\\n" + content`.
- Tool-call arguments as objects (`arguments | tojson`, Qwen 2.5, Hermes): the client's JSON strings are
  parsed to objects first, else the template would print a JSON string of JSON.
- gpt-oss: an assistant's `reasoning_content` is given to the template as `thinking`, which it reads.
- Gemma 4's older templates: tool results move onto the assistant turn as `tool_responses`.
- Thinking: the tags the template writes (`<think>`, Command R7B's `<|START_THINKING|>`), whether its
  generation prompt opens the block itself (DeepSeek R1 distills, QwQ end in `<think>\\n`), and whether it
  reacts to `enable_thinking` (Qwen 3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .chat_format import ChatFormat, detect_format

if TYPE_CHECKING:
    from .template import ChatTemplate

__all__ = ["THINK_TAGS", "TemplateCaps", "adapt_messages", "probe_caps"]

_SYS, _ARG = "\ue010sys-probe\ue010", "\ue010arg-probe\ue010"
# (open, close) pairs of the thinking blocks templates write, most specific first
THINK_TAGS = (
    ("<|START_THINKING|>", "<|END_THINKING|>"),
    ("<seed:think>", "</seed:think>"),
    ("[THINK]", "[/THINK]"),
    ("<think>", "</think>"),
)


@dataclass(frozen=True, slots=True)
class TemplateCaps:
    supports_system_role: bool = True
    object_arguments: bool = False
    think_open: str = ""  # the thinking tags, "" when the template has none
    think_close: str = ""
    forced_open: bool = False  # the generation prompt (thinking on) ends inside an open thinking block
    thinking_switch: bool = False  # the prompt changes with enable_thinking
    maps_developer: bool = True  # the developer role renders as system (all but gpt-oss's channels)
    chat_format: str = ChatFormat.GENERIC  # the output format of the template's model (chat_format)
    gemma4_tool_responses: bool = False  # an older Gemma 4 template: tool results on the assistant turn


def _try(tmpl: ChatTemplate, messages: list[dict[str, Any]], **kw: Any) -> str | None:
    try:
        return tmpl.render(messages, **kw)
    except Exception:  # a probe that fails tells only that this form is not supported
        return None


def _tool_probe() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    call: dict[str, Any] = {
        "id": "call00001",
        "type": "function",
        "function": {"name": "tool1", "arguments": {"arg": _ARG}},
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]
    params = {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}
    tools: list[dict[str, Any]] = [
        {"type": "function", "function": {"name": "tool1", "description": "d", "parameters": params}}
    ]
    return messages, tools


def probe_caps(tmpl: ChatTemplate) -> TemplateCaps:
    """Render probe conversations through the template (each bounded like any render)."""
    user = [{"role": "user", "content": "test"}]
    out = _try(tmpl, [{"role": "system", "content": _SYS}, *user], add_generation_prompt=False)
    system = out is not None and _SYS in out
    messages, tools = _tool_probe()
    out = _try(tmpl, messages, add_generation_prompt=False, tools=tools)
    object_args = out is not None and _ARG in out
    on = _try(tmpl, user, kwargs={"enable_thinking": True}) or ""
    off = _try(tmpl, user, kwargs={"enable_thinking": False}) or ""
    think_open = think_close = ""
    for open_tag, close_tag in THINK_TAGS:
        if open_tag in tmpl.source or open_tag in on:
            think_open, think_close = open_tag, close_tag
            break
    forced = bool(think_open) and on.rstrip().endswith(think_open)
    maps_developer = "<|channel|>" not in tmpl.source
    fmt = detect_format(tmpl.source)
    old_gemma4 = fmt == ChatFormat.GEMMA4 and "{#- OpenAI Chat Completions:" not in tmpl.source
    return TemplateCaps(
        system, object_args, think_open, think_close, forced, on != off, maps_developer, fmt, old_gemma4
    )


def adapt_messages(messages: list[dict[str, Any]], caps: TemplateCaps) -> list[dict[str, Any]]:
    """The messages as this template can render them (llama.cpp's template workarounds)."""
    out = [dict(m) for m in messages]
    for m in out:
        if m.get("role") == "developer" and caps.maps_developer:
            m["role"] = "system"
    if not caps.supports_system_role and out and out[0].get("role") == "system":
        first = out.pop(0)
        if out:
            out[0]["content"] = f"{first.get('content') or ''}\n{out[0].get('content') or ''}"
    if caps.object_arguments:
        for m in out:
            if m.get("tool_calls"):
                m["tool_calls"] = [_object_args(c) for c in m["tool_calls"]]
    if caps.chat_format == ChatFormat.GPT_OSS:
        _harmony_thinking(out)
    if caps.gemma4_tool_responses:
        out = _gemma4_turns(out)
    return out


def _harmony_thinking(messages: list[dict[str, Any]]) -> None:
    """gpt-oss's template reads an assistant's reasoning from `thinking`, and refuses a message with
    tool calls that has both content and thinking (llama.cpp drops that content)."""
    for m in messages:
        if isinstance(m.get("reasoning_content"), str):
            m["thinking"] = m["reasoning_content"]
            if m.get("tool_calls"):
                m.pop("content", None)


def _gemma4_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Gemma 4's older templates read tool results from the assistant message's `tool_responses`: an
    assistant's calls, the tool messages after them and a final answer become one message."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        i += 1
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            out.append(m)
            continue
        calls = list(m["tool_calls"])
        turn: dict[str, Any] = {"role": "assistant", "tool_calls": calls}
        responses: list[dict[str, Any]] = []
        while i < len(messages) and messages[i].get("role") == "tool":
            tool = messages[i]
            i += 1
            body = tool.get("content")
            try:
                response = json.loads(body) if isinstance(body, str) else body
            except ValueError:
                response = body
            fn = calls[len(responses)].get("function") if len(responses) < len(calls) else None
            name = (fn or {}).get("name") or tool.get("tool_call_id") or ""
            responses.append({"name": name, "response": response})
        if responses:
            turn["tool_responses"] = responses
        nxt = messages[i] if i < len(messages) else None
        if (
            nxt is not None
            and nxt.get("role") == "assistant"
            and not nxt.get("tool_calls")
            and nxt.get("content")
        ):
            turn["content"] = nxt["content"]
            i += 1
        if isinstance(m.get("reasoning_content"), str):
            turn["reasoning_content"] = m["reasoning_content"]
        out.append(turn)
    return out


def _object_args(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    from .errors import ApiError

    try:
        args = json.loads(fn["arguments"])
    except ValueError as e:
        raise ApiError(f"Failed to parse tool call arguments as JSON: {e}") from None
    return {**call, "function": {**fn, "arguments": args}}
