"""What a chat template can render, found by rendering probe conversations (as llama.cpp does when it loads
one), and the message rewrites that make up for what it cannot.

- No system role (Gemma 2 raises "System role not supported", others drop it): the system text is merged
  into the next message, `system + "\\n" + content`.
- Tool-call arguments as objects (`arguments | tojson`, Qwen 2.5, Hermes): the client's JSON strings are
  parsed to objects first, else the template would print a JSON string of JSON.
- Thinking: the tags the template writes (`<think>`, Command R7B's `<|START_THINKING|>`), whether its
  generation prompt opens the block itself (DeepSeek R1 distills, QwQ end in `<think>\\n`), and whether it
  reacts to `enable_thinking` (Qwen 3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    return TemplateCaps(system, object_args, think_open, think_close, forced, on != off, maps_developer)


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
