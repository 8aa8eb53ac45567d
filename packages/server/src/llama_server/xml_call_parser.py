"""Qwen3-Coder's XML tool calls (also Qwen3.5/3.6, Nemotron Nano 3, StepFun 3.5), with `<think>` reasoning.

    <think>
    reasoning
    </think>

    content
    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

A value is the text between `<parameter=ARG>\\n` and `\\n</parameter>`, typed by the tool's JSON schema as
llama.cpp types it (`common_chat_params_init_qwen3_coder`): a string parameter keeps the text as it is;
a parameter that cannot be a string is parsed as JSON; one that may be either is JSON when it parses as
one of its other types, else the text. A `<tool_call>` also ends the reasoning (the model may skip
`</think>`), and Qwen3-Coder (no thinking) may skip the first `<tool_call>`.
"""

from __future__ import annotations

import json
from typing import Any

from .chat_parser import Parsed, ToolCall, held_prefix, keep_ids

__all__ = ["XmlCallParser", "value_types"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_CLOSE = "</function>"
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "number": (int, float),
    "integer": int,
    "boolean": bool,
    "null": type(None),
    "string": str,
}
_ALL = frozenset(_JSON_TYPES)


def value_types(schema: Any, depth: int = 0) -> frozenset[str]:
    """The JSON types a schema admits (llama.cpp's `common_chat_schema::value_types`)."""
    if not isinstance(schema, dict) or depth > 16:
        return _ALL
    if "const" in schema:
        return frozenset({_type_name(schema["const"])})
    if isinstance(schema.get("enum"), list):
        return frozenset(_type_name(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return frozenset().union(*(value_types(s, depth + 1) for s in schema[key]))
    t = schema.get("type")
    if isinstance(t, str):
        return frozenset({t, "integer"} if t == "number" else {t}) & _ALL
    if isinstance(t, list):
        return frozenset(x for x in t if x in _ALL) | ({"integer"} if "number" in t else set())
    if "properties" in schema:
        return frozenset({"object"})
    if "items" in schema:
        return frozenset({"array"})
    return _ALL


def _type_name(value: Any) -> str:
    for name, py in _JSON_TYPES.items():
        if name == "integer":
            continue
        if isinstance(value, py) and not (name == "number" and isinstance(value, bool)):
            return name
    return "string"


def _typed(raw: str, types: frozenset[str]) -> Any:
    """The value of one parameter's text under the types its schema admits."""
    if types == {"string"}:
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    if _type_name(value) in types or (isinstance(value, int) and "integer" in types):
        return value
    return raw if "string" in types else value


class XmlCallParser:
    """Parse one reply. `reasoning`: split `<think>` blocks; `tools`: the request's tool definitions (None:
    no tool calls); `forced_open`: the prompt ended in `<think>\\n`; `thinking`: the template writes
    `<think>` (Qwen3.5) rather than not (Qwen3-Coder, which may omit the first `<tool_call>`)."""

    def __init__(
        self, reasoning: bool, tools: list[Any] | None, forced_open: bool = False, thinking: bool = True
    ) -> None:
        self.reasoning = reasoning and thinking
        self.forced_open = forced_open
        self.thinking = thinking
        self.schemas: dict[str, dict[str, frozenset[str]]] | None = None
        if tools is not None:
            self.schemas = {}
            for tool in tools:
                fn = tool.get("function", tool) if isinstance(tool, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                    params = fn.get("parameters")
                    props = params.get("properties") if isinstance(params, dict) else None
                    props = props if isinstance(props, dict) else {}
                    self.schemas[fn["name"]] = {k: value_types(v) for k, v in props.items()}
        self._ids: list[str] = []

    def _starts(self) -> tuple[str, ...]:
        if self.schemas is None:
            return ()
        if self.thinking:
            return (CALL_OPEN,)
        # Qwen3-Coder may begin with a known function's opener (never a bare `<function`, common in code)
        return (CALL_OPEN, *(f"<function={name}>" for name in self.schemas))

    def parse(self, text: str, final: bool) -> Parsed:
        out = Parsed()
        rest: str | None = text
        if self.forced_open and not self.reasoning and self.thinking:
            rest = THINK_OPEN + "\n" + text  # as llama.cpp, the prompt's open block stays in the content
        elif self.reasoning:
            rest = self._reasoning(text, final, out)
        if rest is None:
            return out  # still thinking
        starts = self._starts()
        first = min((i for i in (rest.find(s) for s in starts) if i >= 0), default=-1)
        if first < 0:
            out.content = rest if final else rest[: len(rest) - held_prefix(rest, starts)]
        else:
            out.content = rest[:first]
            self._calls(rest[first:], final, out)
        keep_ids(self._ids, out.tool_calls)
        return out

    def _reasoning(self, text: str, final: bool, out: Parsed) -> str | None:
        """The text after the thinking block (None while it is still open)."""
        body = text
        if not self.forced_open:
            lead = text.lstrip()
            if not lead.startswith(THINK_OPEN):
                if not final and lead and THINK_OPEN.startswith(lead):
                    return None
                return text
            body = lead[len(THINK_OPEN) :]
        body = body.lstrip()
        ends = (THINK_CLOSE, CALL_OPEN) if self.schemas is not None else (THINK_CLOSE,)
        end, tag = -1, ""
        for t in ends:
            i = body.find(t)
            if i >= 0 and (end < 0 or i < end):
                end, tag = i, t
        if end < 0:
            out.reasoning = body if final else body[: len(body) - held_prefix(body, ends)]
            if out.reasoning.isspace():
                out.reasoning = ""
            return None
        out.reasoning = "" if body[:end].isspace() else body[:end]
        if tag == CALL_OPEN:
            return body[end:]
        return body[end + len(THINK_CLOSE) :].lstrip()

    def _calls(self, text: str, final: bool, out: Parsed) -> None:
        """The calls in `text`, which starts at the first call; a call counts once its function closes."""
        pos = 0
        while True:
            start = text.find("<function=", pos)
            if start < 0:
                return
            name_end = text.find(">", start)
            close = text.find(FUNCTION_CLOSE, start)
            if name_end < 0 or (close < 0 and not final):
                return
            body = text[name_end + 1 : close if close >= 0 else len(text)]
            name = text[start + len("<function=") : name_end].strip()
            out.tool_calls.append(ToolCall(name, json.dumps(self._args(name, body), ensure_ascii=False)))
            if close < 0:
                return
            pos = close + len(FUNCTION_CLOSE)

    def _args(self, name: str, body: str) -> dict[str, Any]:
        types = (self.schemas or {}).get(name, {})
        args: dict[str, Any] = {}
        pos = 0
        while True:
            start = body.find("<parameter=", pos)
            if start < 0:
                return args
            name_end = body.find(">", start)
            if name_end < 0:
                return args
            arg = body[start + len("<parameter=") : name_end].strip()
            value_start = name_end + 1 + (body.startswith("\n", name_end + 1))
            end = body.find("\n</parameter>", value_start - 1)
            size = len("\n</parameter>")
            if end < 0:
                end, size = body.find("</parameter>", value_start), len("</parameter>")
            if end < 0:
                end, size = len(body), 0
            raw = body[value_start : max(end, value_start)]
            args[arg] = _typed(raw, types.get(arg, _ALL))
            pos = end + size
