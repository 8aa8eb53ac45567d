"""Chat templates: untrusted Jinja code from model files, rendered in a sandbox with limits.

A model's `tokenizer.chat_template` has given remote code execution to servers that rendered it with a
plain Jinja environment, so it is rendered in `ImmutableSandboxedEnvironment` with, on top of what the
sandbox does, a bound on render time (a line tracer checks a deadline), on output size (the output is
generated in chunks and counted) and on what the template builds on the way (`template_bounds`: every
string and list an operator, filter or str method builds is sized, most of them before they allocate, and
a render builds at most 64 MiB in all).

Message text from users is wrapped in marker characters while rendering, so that after rendering the
prompt splits into template text (tokenized with special-token parsing) and user text (tokenized without
it): a user cannot inject `<|im_start|>system`.
"""

from __future__ import annotations

import functools
import re
import string
import sys
import threading
import time
import types
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .template_bounds import (
    MAX_CHARS,
    TemplateError,
    built,
    check_binop,
    check_format,
    concat_chunks,
    concat_operands,
    metered,
    str_method,
    to_text,
)
from .template_caps import TemplateCaps, probe_caps
from .template_filters import bounded_filters, bounded_lipsum

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
MAX_OUTPUT_CHARS = MAX_CHARS
# methods refused: `encode` makes bytes (whose methods are not bounded), `to_bytes` allocates by an argument
_UNSAFE_METHODS = frozenset({"encode", "to_bytes"})
_FORMAT_WIDTH = re.compile(r"%[-+ #0]*\d{5,}|\{[^}]*\d{5,}")


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


class _CodeGenerator(CodeGenerator):
    """Jinja's compiler, with `~` sized before it joins its operands and slices counted once taken (both
    compile to plain Python, not through the sandbox's hooks)."""

    @optimizeconst
    def visit_Getitem(self, node: nodes.Getitem, frame: Frame) -> None:
        if not isinstance(node.arg, nodes.Slice):
            return super().visit_Getitem(node, frame)
        self.write("environment.slice_of(")
        self.visit(node.node, frame)
        self.write(", slice(")
        for i, part in enumerate((node.arg.start, node.arg.stop, node.arg.step)):
            self.write(", " if i else "")
            if part is None:
                self.write("None")
            else:
                self.visit(part, frame)
        self.write("))")
        return None

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        volatile = frame.eval_ctx.volatile
        join = "(markup_join if context.eval_ctx.volatile else str_join)" if volatile else None
        join = join or ("markup_join" if frame.eval_ctx.autoescape else "str_join")
        self.write(f"environment.concat_operands({join}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _Env(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%", "+", "~"})
    code_generator_class = _CodeGenerator
    # a macro's or a block's output, `~`, and `{{ value }}` of a container: sized before they are built
    concat = staticmethod(concat_chunks)
    concat_operands = staticmethod(concat_operands)
    # ids of the lists and dicts passed in for the render running on this thread (see `render`)
    inputs: Any = None

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        # as llama.cpp's engine: an undefined or null operand next to a string counts as ""
        nulls = operator in ("+", "~") and (_is_null(left) or _is_null(right))
        if nulls and (isinstance(left, str) or isinstance(right, str)):
            return built(
                ("" if _is_null(left) else to_text(left)) + ("" if _is_null(right) else to_text(right))
            )
        if operator == "%" and isinstance(left, str) and (_FORMAT_WIDTH.search(left) or "%*" in left):
            raise TemplateError("format width too large in the template")
        check_binop(operator, left, right)
        return built(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        # what a global such as `dict`, `namespace` or `cycler` (or a method) returns is counted as built,
        # so that a loop keeping copies (`l.append(namespace(d))`) stops at MAX_LIVE_BYTES
        result = super().call(__context, __obj, *args, **kwargs)
        frozen = getattr(__self.inputs, "ids", None) or ()
        if isinstance(result, list | tuple | dict) and id(result) not in frozen:
            built(result)
        elif isinstance(result, jinja2.utils.Namespace):
            built(result._Namespace__attrs)  # type: ignore[attr-defined]
        elif isinstance(result, jinja2.utils.Cycler):
            built(result.items)
        return result

    @staticmethod
    def slice_of(obj: Any, part: slice) -> Any:
        return built(obj[part])

    def wrap_str_format(self, value: Any) -> Any:
        # every attribute a template reads passes here: str methods come back sized (see `str_method`)
        owner = getattr(value, "__self__", None)
        if not isinstance(owner, str) or not isinstance(value, types.BuiltinMethodType | types.MethodType):
            return None
        if value.__name__ in _UNSAFE_METHODS:
            return None  # is_safe_attribute refuses it
        if value.__name__ not in ("format", "format_map"):
            return str_method(value)
        # the sandbox's str.format bounds no padding width ('{:>999999999}'): only format strings whose
        # field specs are literal and narrow are allowed (Hunyuan's template formats its tool list)
        if not _narrow_format(owner):
            return _refuse_format
        return _bounded_format_method(owner, value.__name__, super().wrap_str_format(value))

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, str | int) and attr in _UNSAFE_METHODS:
            return False
        if isinstance(obj, list) and attr in _LOCAL_LIST_METHODS:
            frozen = getattr(self.inputs, "ids", None)
            return frozen is not None and id(obj) not in frozen and len(obj) < MAX_LOCAL_LIST
        return super().is_safe_attribute(obj, attr, value)


def _bounded_format_method(fmt: str, name: str, sandboxed: Any) -> Any:
    def bounded(*args: Any, **kwargs: Any) -> str:
        if name == "format_map" and len(args) == 1 and isinstance(args[0], dict):
            check_format(fmt, (), args[0])
        else:
            check_format(fmt, args, kwargs)
        return built(sandboxed(*args, **kwargs))  # type: ignore[no-any-return]

    return bounded


def _finalize(value: Any) -> Any:
    """What `{{ value }}` writes: a container's text is sized before it is built."""
    return value if isinstance(value, str | int | float) or value is None else to_text(value)


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


def _make_env() -> _Env:
    env = _Env(
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.Undefined,
        autoescape=False,
        finalize=_finalize,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.inputs = threading.local()
    env.filters.update(bounded_filters())
    env.globals["lipsum"] = bounded_lipsum
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
            with metered():
                for chunk in self._template.generate(**ctx):
                    size += len(chunk)
                    if size > MAX_OUTPUT_CHARS:
                        raise TemplateError("the template's output is too large")
                    parts.append(chunk)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise TemplateError(f"the chat template did something unsafe: {e}") from e
        except (
            jinja2.TemplateError,
            TypeError,
            ValueError,
            AttributeError,
            KeyError,
            IndexError,
            AssertionError,  # Jinja's truncate asserts its arguments
        ) as e:
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
