"""Structured output: the grammar a request's output must follow (endpoints.md §2.1, §5.1, §6).

Where a grammar comes from, first match wins:
- chat with `tools` and `tool_choice` "required" or a named function: a grammar over the template's
  tool-call format (`tool_call_grammar`), one call when `parallel_tool_calls` is false;
- `grammar` (GBNF text) when the request has it, else `json_schema`, or for chat `response_format`
  (`json_object` with an optional `schema`, `json_schema` with `json_schema.schema`);
- the server defaults from `--grammar`/`--grammar-file`/`-j`/`-jf`.
An empty schema means any object. A schema that cannot be honoured, or a grammar that does not parse,
is a 400 before anything is queued. `grammar_lazy`, `grammar_triggers` and `preserved_tokens` map onto
the engine's lazy-grammar fields as llama-server maps them.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from llama_engine.grammar import GrammarError, parse_grammar
from llama_engine.grammar.schema import SchemaError, json_schema_to_grammar
from llama_engine.grammar.schema.converter import SchemaConverter
from llama_engine.grammar.schema.rules import dump_json, format_literal
from llama_engine.grammar.triggers import GrammarTrigger, TriggerType
from llama_engine.tokenizer import Tokenizer

from .errors import ApiError
from .schemas import ChatBody, GenParams

if TYPE_CHECKING:
    from .state import ServerState
    from .template import ChatTemplate

__all__ = [
    "GrammarFields",
    "chat_json_schema",
    "check_grammar",
    "default_grammar",
    "grammar_fields",
    "schema_grammar",
    "text_format_to_response_format",
    "tool_call_grammar",
]


class GrammarFields(msgspec.Struct, frozen=True, kw_only=True):
    """The grammar fields of the engine's SamplingParams for one request."""

    grammar: str = ""
    grammar_lazy: bool = False
    grammar_triggers: tuple[GrammarTrigger, ...] = ()
    preserved_tokens: tuple[int, ...] = ()


def schema_grammar(schema: Any) -> str:
    """The grammar of a JSON schema; `{}` means any object (as llama-server). SchemaError -> 400."""
    if isinstance(schema, dict) and not schema:
        schema = {"type": "object"}
    try:
        return json_schema_to_grammar(schema)
    except SchemaError as e:
        raise ApiError(f'"json_schema": JSON schema conversion failed:\n{e}') from e


def check_grammar(text: str) -> None:
    """Parse `text` as GBNF (a short grammar is checked once, then cached); GrammarError -> 400."""
    if len(text) <= _CACHED_GRAMMAR_CHARS:
        _check_cached(text)
    else:
        _check(text)


_CACHED_GRAMMAR_CHARS = 1 << 16  # the cache holds at most 64 grammars of this size


@functools.lru_cache(maxsize=64)
def _check_cached(text: str) -> None:
    _check(text)


def _check(text: str) -> None:
    try:
        parse_grammar(text)
    except GrammarError as e:
        raise ApiError(f"Failed to initialize samplers: failed to parse grammar ({e})") from e
    except RecursionError as e:
        raise ApiError("Failed to initialize samplers: failed to parse grammar (nested too deeply)") from e


def chat_json_schema(body: ChatBody) -> Any:
    """The chat request's JSON schema: `json_schema`, replaced by `response_format`'s (None: none)."""
    schema = body.json_schema
    rf = body.response_format
    if rf is not None:
        if rf.type == "json_object":
            if rf.schema is not None or schema is None:
                schema = rf.schema if rf.schema is not None else {}
        elif rf.type == "json_schema":
            wrapper = rf.json_schema if isinstance(rf.json_schema, dict) else {}
            schema = wrapper.get("schema", {})
        elif rf.type != "text":
            raise ApiError(f'response_format type must be one of "text" or "json_object", but got: {rf.type}')
    return schema


def text_format_to_response_format(text: Any) -> dict[str, Any] | None:
    """The Responses API's `text.format` as a chat `response_format`."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {"schema": fmt.get("schema", {}), "name": fmt.get("name")},
        }
    return {"type": fmt.get("type", "text")}


# -- tool calls ----------------------------------------------------------------------------------------


def _tool_format(template: ChatTemplate | None) -> str:
    """Which of the tool-call formats `chat_parser` reads the template writes."""
    src = template.source if template is not None else ""
    if "<tool_call>" in src:
        return "hermes"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if "<|python_tag|>" in src or "<|start_header_id|>" in src:
        return "llama3"
    return "json"


def _selected_tools(body: ChatBody, fmt: str) -> list[dict[str, Any]] | None:
    """The tools a call must be to (None: calls are not constrained). With tool_choice "auto" and
    `parallel_tool_calls: false` every tool, under a lazy grammar (the formats with an opening tag)."""
    choice = body.tool_choice
    tools = [t.get("function", t) for t in body.tools or [] if isinstance(t, dict)]
    tools = [t for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]
    if choice in (None, "auto"):
        return tools or None if body.parallel_tool_calls is False and fmt in _OPENING_TAGS else None
    if choice == "required":
        if not tools:
            raise ApiError('tool_choice "required" needs at least one function in tools')
        return tools
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
        chosen = [t for t in tools if t["name"] == name]
        if not chosen:
            raise ApiError(f"tool_choice names a function that is not in tools: {name}")
        return chosen
    return None


_OPENING_TAGS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]"}


def tool_call_grammar(body: ChatBody, template: ChatTemplate | None) -> tuple[str, str] | None:
    """(grammar, trigger) constraining tool calls to the selected tools in the template's format; the
    trigger is the opening tag that starts a lazy grammar ("" when the whole reply is calls); None when
    calls are not constrained."""
    fmt = _tool_format(template)
    tools = _selected_tools(body, fmt)
    if tools is None:
        return None
    lazy = body.tool_choice in (None, "auto")
    args_key = "parameters" if fmt == "llama3" else "arguments"
    conv = SchemaConverter({})
    # a call is written compactly: a small model given llama.cpp's whitespace rule spends its tokens on it
    conv.rules["space"] = '| " "'
    calls = []
    try:
        for i, tool in enumerate(tools):
            params = tool.get("parameters") or {"type": "object"}
            conv.root = params  # a tool's $refs point into its own parameters
            args = conv.visit(params, f"tool-{i}-args")
            name = conv.add_rule(f"tool-{i}-name", f'"\\"" {_literal_body(tool["name"])} "\\""')
            calls.append(
                conv.add_rule(
                    f"tool-{i}-call",
                    f'"{{" space "\\"name\\"" space ":" space {name} "," space '
                    f'"\\"{args_key}\\"" space ":" space {args} space "}}"',
                )
            )
    except SchemaError as e:
        raise ApiError(f"tool parameters: JSON schema conversion failed:\n{e}") from e
    call = conv.add_rule("tool-call", " | ".join(calls))
    parallel = body.parallel_tool_calls is not False and fmt in ("hermes", "mistral")
    if fmt == "hermes":
        one = conv.add_rule("tool-call-block", '"<tool_call>" "\\n"? tool-call "\\n"? "</tool_call>"')
        root = f'{one} ("\\n" {one})*' if parallel else one
    elif fmt == "mistral":
        root = (
            f'"[TOOL_CALLS]" "[" {call} ("," space {call})* "]"'
            if parallel
            else f'"[TOOL_CALLS]" "[" {call} "]"'
        )
    else:
        root = call
    conv.add_rule("root", root)
    return conv.format_grammar(), _OPENING_TAGS[fmt] if lazy else ""


def _literal_body(text: str) -> str:
    """`text` JSON-encoded, as a GBNF literal."""
    return format_literal(dump_json(text)[1:-1])


# -- the request's grammar fields ------------------------------------------------------------------------


def _request_grammar(p: GenParams, default: str, template: ChatTemplate | None) -> str | tuple[str, str]:
    """The grammar text, or for tool calls (grammar, lazy trigger tag)."""
    if isinstance(p, ChatBody):
        if p.grammar and p.tools and p.tool_choice != "none":
            raise ApiError("Cannot use custom grammar constraints with tools.")
        forced = tool_call_grammar(p, template) if p.tools and p.tool_choice != "none" else None
        if forced is not None:
            return forced
        if p.grammar and p.tools and p.tool_choice != "none":
            raise ApiError("Cannot use custom grammar constraints with tools.")
        if p.grammar:
            return p.grammar
        schema = chat_json_schema(p)
        return schema_grammar(schema) if schema is not None else default
    if p.grammar is not None:
        return p.grammar
    if p.json_schema is not None:
        return schema_grammar(p.json_schema)
    return default


def _triggers(p: GenParams, tok: Tokenizer, preserved: set[int]) -> tuple[GrammarTrigger, ...]:
    out: list[GrammarTrigger] = []
    for t in p.grammar_triggers or []:
        try:
            kind = TriggerType(t.type)
        except ValueError:
            raise ApiError(f"grammar_triggers: unknown trigger type {t.type}") from None
        if kind == TriggerType.WORD:
            ids = tok.encode(t.value, add_special=False, parse_special=True)
            if len(ids) == 1:
                if ids[0] not in preserved:
                    raise ApiError(f"Grammar trigger word should be marked as preserved token: {t.value}")
                out.append(GrammarTrigger(type=TriggerType.TOKEN, value=t.value, token=ids[0]))
                continue
        if kind == TriggerType.TOKEN and t.token is None:
            raise ApiError("grammar_triggers: a token trigger needs a 'token' id")
        out.append(GrammarTrigger(type=kind, value=t.value, token=-1 if t.token is None else t.token))
    return tuple(out)


def _fields(
    p: GenParams, default: GrammarFields, tok: Tokenizer, template: ChatTemplate | None
) -> GrammarFields:
    got = _request_grammar(p, default.grammar, template)
    grammar, tag = got if isinstance(got, tuple) else (got, "")
    if grammar:
        check_grammar(grammar)
    words = list(p.preserved_tokens or [])
    if tag:  # the opening and closing tags stay in the text the chat parser reads
        words += [tag, "</tool_call>"]
    preserved = {
        ids[0] for s in words if len(ids := tok.encode(s, add_special=False, parse_special=True)) == 1
    }
    triggers = _triggers(p, tok, preserved)
    lazy = p.grammar_lazy if p.grammar_lazy is not None else default.grammar_lazy
    if tag:
        lazy, triggers = True, (GrammarTrigger(type=TriggerType.PATTERN, value=re.escape(tag)),)
    if lazy and grammar and not triggers:
        raise ApiError("Error: no triggers set for lazy grammar!")
    return GrammarFields(
        grammar=grammar,
        grammar_lazy=bool(lazy),
        grammar_triggers=triggers,
        preserved_tokens=tuple(sorted(preserved)) or default.preserved_tokens,
    )


async def grammar_fields(state: ServerState, p: GenParams) -> GrammarFields:
    """The request's grammar fields, checked (off the event loop: parsing a grammar may take a while)."""
    d = state.config.sampling
    default = GrammarFields(grammar=d.grammar)
    nothing = not (p.grammar or p.json_schema is not None or p.grammar_triggers or p.preserved_tokens)
    if isinstance(p, ChatBody):
        nothing = (
            nothing
            and p.response_format is None
            and not (
                p.tools and (p.tool_choice not in (None, "auto", "none") or p.parallel_tool_calls is False)
            )
        )
    if nothing and not default.grammar:
        return default
    tok = state.require_engine().tokenizer
    return await state.offload(_fields, p, default, tok, state.template)


def default_grammar(kw: dict[str, Any]) -> str:
    """The server's default grammar from `--grammar`, `--grammar-file`, `-j` or `-jf` (the last that is
    set of grammar / schema wins as in llama.cpp's argument order: a schema replaces a grammar)."""
    import click

    text = kw.get("grammar") or ""
    if kw.get("grammar_file"):
        text = Path(kw["grammar_file"]).read_text()
    schema_text = kw.get("json_schema")
    if kw.get("json_schema_file"):
        schema_text = Path(kw["json_schema_file"]).read_text()
    try:
        if schema_text:
            try:
                schema = json.loads(schema_text)
            except ValueError as e:
                raise click.UsageError(f"invalid JSON schema: {e}") from None
            text = schema_grammar(schema)
        if text:
            check_grammar(text)
    except ApiError as e:
        raise click.UsageError(e.message) from None
    return text
