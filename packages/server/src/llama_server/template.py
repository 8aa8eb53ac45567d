"""Chat templates: untrusted Jinja code from model files, rendered in a sandbox with limits.

A model's `tokenizer.chat_template` has given remote code execution to servers that rendered it with a
plain Jinja environment, so it is rendered in `ImmutableSandboxedEnvironment` with, on top of what the
sandbox does, a bound on render time (a line tracer checks a deadline) and on output size (the output is
generated in chunks and counted; string repetition and padding are capped before they allocate).

Message text from users is wrapped in marker characters while rendering, so that after rendering the
prompt splits into template text (tokenized with special-token parsing) and user text (tokenized without
it): a user cannot inject `<|im_start|>system`.
"""

from __future__ import annotations

import functools
import json
import re
import string
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .template_caps import TemplateCaps, probe_caps

__all__ = ["BUILTIN_TEMPLATES", "ChatTemplate", "TemplateError"]

# llama.cpp falls back to chatml when the model has no template (llama_model_chat_template -> "chatml").
CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)
LLAMA3 = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}"
)
GEMMA = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"
)
BUILTIN_TEMPLATES: dict[str, str] = {"chatml": CHATML, "llama3": LLAMA3, "gemma": GEMMA}

# Message text is wrapped in two private-use characters while rendering (also found JSON-escaped, when a
# template writes content through `tojson(ensure_ascii=True)`).
BEGIN, END = "\ue000", "\ue001"
_MARKER = re.compile(r"\ue000|\ue001|\\ue000|\\ue001")
MAX_RENDER_SECONDS = 2.0
MAX_OUTPUT_CHARS = 4 * 1024 * 1024
# str methods that allocate by a caller-given width: refused (the filters below are bounded instead)
_UNSAFE_STR_METHODS = frozenset({"format", "format_map", "ljust", "rjust", "center", "zfill", "expandtabs"})
_FORMAT_WIDTH = re.compile(r"%[-+ #0]*\d{5,}|\{[^}]*\d{5,}")


class TemplateError(Exception):
    """The template failed, ran too long or produced too much text."""


# list methods a template may call on lists it built itself (Kimi K2 queues tool-call ids); never on inputs
_LOCAL_LIST_METHODS = frozenset({"append", "pop"})
MAX_LOCAL_LIST = 65536


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (Hugging Face's marker of assistant text for training
    masks): renders its body unchanged."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 reads this class attribute)

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _is_null(value: Any) -> bool:
    return value is None or isinstance(value, jinja2.Undefined)


class _Env(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%", "+", "~"})
    # ids of the lists and dicts passed in for the render running on this thread (see `render`)
    inputs: Any = None

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        # as llama.cpp's engine: an undefined or null operand next to a string counts as ""
        nulls = operator in ("+", "~") and (_is_null(left) or _is_null(right))
        if nulls and (isinstance(left, str) or isinstance(right, str)):
            return ("" if _is_null(left) else str(left)) + ("" if _is_null(right) else str(right))
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple)
                    and isinstance(n, int)
                    and len(seq) * n > MAX_OUTPUT_CHARS
                ):
                    raise TemplateError("the template's output is too large")
        if operator == "%" and isinstance(left, str) and (_FORMAT_WIDTH.search(left) or "%*" in left):
            raise TemplateError("format width too large in the template")
        if operator == "**" and isinstance(right, int) and abs(right) > 1024:
            raise TemplateError("exponent too large in the template")
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Any:
        # the sandbox's str.format bounds no padding width ('{:>999999999}'): only format strings whose
        # field specs are literal and narrow are allowed (Hunyuan's template formats its tool list)
        fmt = getattr(value, "__self__", None)
        is_format = getattr(value, "__name__", None) in ("format", "format_map")
        if is_format and isinstance(fmt, str) and not _narrow_format(fmt):
            return _refuse_format
        return super().wrap_str_format(value)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, str) and attr in _UNSAFE_STR_METHODS:
            return False
        if isinstance(obj, list) and attr in _LOCAL_LIST_METHODS:
            frozen = getattr(self.inputs, "ids", None)
            return frozen is not None and id(obj) not in frozen and len(obj) < MAX_LOCAL_LIST
        return super().is_safe_attribute(obj, attr, value)


def _refuse_format(*args: Any, **kwargs: Any) -> None:
    raise TemplateError("str.format with a computed or wide field is not available in chat templates")


def _narrow_format(fmt: str) -> bool:
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return False
    for _, name, spec, _ in fields:
        if name is None:
            continue
        if "{" in (name + (spec or "")) or (spec and re.search(r"\d{4,}", spec)):
            return False
    return True


def _raise(message: str) -> None:
    raise TemplateError(str(message))


def _json_default(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        return None
    if isinstance(value, Iterator | tuple | set | range):  # a filter chain's generator: its items
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(
    value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys, default=_json_default
    )


def _bounded_format(value: str, *args: Any, **kwargs: Any) -> str:
    if _FORMAT_WIDTH.search(str(value)):
        raise TemplateError("format width too large in the template")
    return jinja2.filters.do_format(value, *args, **kwargs)


def _bounded_center(value: str, width: int = 80) -> str:
    if int(width) > MAX_OUTPUT_CHARS:
        raise TemplateError("the template's output is too large")
    return str(value).center(int(width))


def _bounded_indent(value: str, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    if (isinstance(width, int) and width > 1024) or (isinstance(width, str) and len(width) > 1024):
        raise TemplateError("indent width too large in the template")
    return jinja2.filters.do_indent(value, width, first, blank)


def _make_env() -> _Env:
    env = _Env(
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.Undefined,
        autoescape=False,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.inputs = threading.local()
    env.filters["tojson"] = _tojson
    env.filters["format"] = _bounded_format
    env.filters["center"] = _bounded_center
    env.filters["indent"] = _bounded_indent
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(str(fmt)[:64])
    return env


class ChatTemplate:
    """A compiled chat template plus the special-token texts it is rendered with."""

    @functools.cached_property
    def caps(self) -> TemplateCaps:
        """What the template supports (probed on first use: a few bounded renders)."""
        return probe_caps(self)

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._env = _make_env()
        try:
            self._template = self._env.from_string(source)
        except jinja2.TemplateError as e:
            raise TemplateError(f"invalid chat template: {e}") from e

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text, as the template writes it."""
        today = datetime.now()
        ctx: dict[str, Any] = {
            # what llama.cpp puts in every template's context (kwargs may override them)
            "datetime": today.strftime("%b %d %Y"),
            "date_string": today.strftime("%d %b %Y"),
            **(kwargs or {}),
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        if tools:
            ctx["tools"] = tools
        return self._render(ctx)

    def render_segments(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> list[tuple[str, bool]]:
        """The prompt as (text, is_user_text) pieces: user text must be tokenized without special tokens."""
        text = self.render([_mark(m) for m in messages], add_generation_prompt, tools, kwargs)
        # Walk the markers. Text between a BEGIN and an END is the user's. A marker the template cut off
        # (slicing content) errs on the safe side: text before an unmatched END, or after an unmatched
        # BEGIN, counts as user text too (tokenized without special tokens).
        out: list[tuple[str, bool]] = []
        inside, pos = False, 0
        for m in _MARKER.finditer(text):
            piece = text[pos : m.start()]
            is_end = m.group(0) in (END, "\\ue001")
            if piece:
                out.append((piece, inside or is_end))
            inside = not is_end
            pos = m.end()
        if pos < len(text):
            out.append((text[pos:], inside))
        return out

    def _render(self, ctx: dict[str, Any]) -> str:
        deadline = time.monotonic() + MAX_RENDER_SECONDS
        previous = sys.gettrace()

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            if time.monotonic() > deadline:
                raise TemplateError("the chat template took too long to render")
            return tracer

        parts: list[str] = []
        size = 0
        self._env.inputs.ids = _container_ids(ctx)
        sys.settrace(tracer)
        try:
            for chunk in self._template.generate(**ctx):
                size += len(chunk)
                if size > MAX_OUTPUT_CHARS:
                    raise TemplateError("the template's output is too large")
                parts.append(chunk)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"the chat template did something unsafe: {e}") from e
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            raise TemplateError(f"error rendering the chat template: {e}") from e
        except (RecursionError, MemoryError, OverflowError) as e:
            raise TemplateError(f"error rendering the chat template: {type(e).__name__}") from e
        finally:
            sys.settrace(previous)
            self._env.inputs.ids = None
        return "".join(parts)


def _container_ids(value: Any, out: set[int] | None = None) -> set[int]:
    """The ids of every list and dict reachable from the render's inputs: those stay immutable."""
    out = set() if out is None else out
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict | list) and id(v) not in out:
            out.add(id(v))
            stack.extend(v.values() if isinstance(v, dict) else v)
    return out


def _mark(message: dict[str, Any]) -> dict[str, Any]:
    """Wrap the message's text in markers (marker characters already in it become U+FFFD)."""
    out = dict(message)

    def wrap(text: str) -> str:
        return BEGIN + text.replace(BEGIN, "\ufffd").replace(END, "\ufffd") + END

    for key in ("content", "reasoning_content"):
        value = out.get(key)
        if isinstance(value, str) and value:
            out[key] = wrap(value)
        elif isinstance(value, list):
            out[key] = [
                {**p, "text": wrap(p["text"])}
                if isinstance(p, dict) and isinstance(p.get("text"), str)
                else p
                for p in value
            ]
    return out
