"""The filters and globals a chat template gets: Jinja's own, each one that builds a string or a list
bounded by `template_bounds` (sized before it allocates where its result can outgrow its input), plus the
`tojson` that Hugging Face templates expect."""

from __future__ import annotations

import functools
import json
import pprint
import textwrap
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jinja2
import jinja2.filters as jf
from jinja2 import pass_environment, pass_eval_context

from .template_bounds import (
    LINE_BREAKS,
    TemplateError,
    built,
    check_chars,
    check_items,
    check_percent,
    join_text,
    replace_text,
    take,
    text_size,
    to_text,
)

__all__ = ["bounded_filters", "bounded_lipsum"]

MAX_JSON_INDENT = 64
MAX_LIPSUM_WORDS = 100_000


def _json_default(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        return None
    if isinstance(value, Iterator | tuple | set | range):  # a filter chain's generator: its items
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(
    value: Any, indent: int | str | None = None, ensure_ascii: bool = False, sort_keys: bool = False
) -> str:
    width = len(indent) if isinstance(indent, str) else indent or 0
    if width > MAX_JSON_INDENT:
        raise TemplateError("tojson indent too large in the template")
    check_chars(text_size(value, indent=width + 1))
    out = json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys, default=_json_default
    )
    return built(out)  # type: ignore[no-any-return]


def _text_in(fn: Callable[..., Any], arg: int = 0) -> Callable[..., Any]:
    """`fn` with its text argument (positional `arg`) turned into text first, bounded, and what it
    returns counted: for filters whose result is at most a few times their input (case, escaping)."""

    @functools.wraps(fn)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if len(args) > arg and not hasattr(args[arg], "__html__"):
            args = (*args[:arg], to_text(args[arg]), *args[arg + 1 :])
        return built(fn(*args, **kwargs))

    return bounded


def _measured(fn: Callable[..., Any], arg: int = 0, indent: int = 0) -> Callable[..., Any]:
    """`fn`, refused when the text of its argument is too large, and what it returns counted: for filters
    that write a whole value out (pprint, xmlattr, urlencode)."""

    @functools.wraps(fn)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if len(args) > arg:
            check_chars(text_size(args[arg], indent=indent))
        return built(fn(*args, **kwargs))

    return bounded


def _items_in(fn: Callable[..., Any], arg: int = 0) -> Callable[..., Any]:
    """`fn` over at most `MAX_ITEMS` items, and the list it returns counted: sort, unique, groupby..."""

    @functools.wraps(fn)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if len(args) > arg and not isinstance(args[arg], str | Mapping):
            args = (*args[:arg], take(args[arg]), *args[arg + 1 :])
        return built(fn(*args, **kwargs))

    return bounded


def _groups(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`groupby`, each group's list counted too."""

    @functools.wraps(fn)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        groups = fn(*args, **kwargs)
        for group in groups:
            built(group.list)
        return groups

    return bounded


@pass_eval_context
def _join(eval_ctx: Any, value: Any, d: Any = "", attribute: Any = None) -> str:
    if attribute is not None:
        value = map(jf.make_attrgetter(eval_ctx.environment, attribute), value)
    if eval_ctx.autoescape:
        return built(jf.sync_do_join(eval_ctx, take(value), d))  # type: ignore[no-any-return]
    return join_text(to_text(d), value, convert=True)


@pass_eval_context
def _replace(eval_ctx: Any, s: Any, old: Any, new: Any, count: int | None = None) -> str:
    s, old, new = to_text(s), to_text(old), to_text(new)
    if eval_ctx.autoescape:
        n = s.count(old) if count is None else min(s.count(old), count)
        check_chars(len(s) + n * 6 * len(new))
        return built(jf.do_replace(eval_ctx, s, old, new, count))  # type: ignore[no-any-return]
    return replace_text(s, old, new, -1 if count is None else count)


def _format(value: Any, *args: Any, **kwargs: Any) -> str:
    fmt = to_text(value)
    check_percent(fmt, kwargs or args)
    return built(jf.do_format(fmt, *args, **kwargs))  # type: ignore[no-any-return]


def _center(value: Any, width: int = 80) -> str:
    check_chars(int(width))
    return built(to_text(value).center(int(width)))  # type: ignore[no-any-return]


def _indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    s = to_text(s)
    if isinstance(width, int):
        check_chars(width)
    lines = sum(map(s.count, LINE_BREAKS)) + 2
    check_items(lines)
    check_chars(len(s) + lines * (len(width) if isinstance(width, str) else int(width)))
    return built(jf.do_indent(s, width, first, blank))  # type: ignore[no-any-return]


@pass_environment
def _wordwrap(
    environment: Any,
    s: Any,
    width: int = 79,
    break_long_words: bool = True,
    wrapstring: Any = None,
    break_on_hyphens: bool = True,
) -> str:
    s = to_text(s)
    sep = environment.newline_sequence if wrapstring is None else to_text(wrapstring)
    check_items(len(s) // 2 + 1)  # textwrap splits the text into words first
    wrapped = [
        textwrap.wrap(
            line,
            width=width,
            expand_tabs=False,
            replace_whitespace=False,
            break_long_words=break_long_words,
            break_on_hyphens=break_on_hyphens,
        )
        for line in s.splitlines()
    ]
    seps = sum(max(len(ws) - 1, 0) for ws in wrapped) + max(len(wrapped) - 1, 0)
    check_chars(sum(len(w) for ws in wrapped for w in ws) + seps * len(sep))
    return built(sep.join(sep.join(ws) for ws in wrapped))  # type: ignore[no-any-return]


@pass_environment
def _truncate(
    env: Any, s: Any, length: int = 255, killwords: bool = False, end: Any = "...", leeway: Any = None
) -> str:
    return built(jf.do_truncate(env, to_text(s), length, killwords, to_text(end), leeway))  # type: ignore[no-any-return]


def _list(value: Any) -> list[Any]:
    items = take(value)
    return built(list(items), pieces=isinstance(value, str))  # type: ignore[no-any-return]


def _reverse(value: Any) -> Any:
    if isinstance(value, str):
        return built(value[::-1])
    return built(jf.do_reverse(take(value)))


def _batch(value: Any, linecount: int, fill_with: Any = None) -> Iterator[list[Any]]:
    check_items(int(linecount))
    return jf.do_batch(take(value), linecount, fill_with)


def _slice(value: Any, slices: int, fill_with: Any = None) -> Iterator[list[Any]]:
    check_items(int(slices))
    return jf.sync_do_slice(take(value), slices, fill_with)


@pass_environment
def _sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    if attribute is not None:
        iterable = map(jf.make_attrgetter(environment, attribute), iterable)
    items = take(iterable)
    if not isinstance(start, list | tuple):
        return sum(items, start)
    # lists add up in linear time (the builtin sum copies the partial list at every step)
    out = list(start)
    for x in items:
        if type(x) is not type(start):
            raise TypeError(f'can only concatenate {type(start).__name__} (not "{type(x).__name__}")')
        check_items(len(out) + len(x))
        out.extend(x)
    return built(out if isinstance(start, list) else tuple(out))


def _pprint(value: Any) -> str:
    check_chars(text_size(value, indent=1))
    return built(pprint.pformat(value))  # type: ignore[no-any-return]


def _urlize(*args: Any, **kwargs: Any) -> str:
    raise TemplateError("the urlize filter is not available in chat templates")


def bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """Jinja's `lipsum`, at most `MAX_LIPSUM_WORDS` words."""
    if int(n) * int(max) > MAX_LIPSUM_WORDS:
        raise TemplateError("lipsum too large in the template")
    return built(jinja2.utils.generate_lorem_ipsum(n, html, min, max))  # type: ignore[no-any-return]


def bounded_filters() -> dict[str, Callable[..., Any]]:
    """Every filter of Jinja's default set that builds a string or a list, bounded."""
    text = {
        name: _text_in(jf.FILTERS[name])
        for name in ("capitalize", "lower", "upper", "title", "trim", "striptags", "wordcount", "string")
    }
    text.update({name: _text_in(jf.FILTERS[name]) for name in ("e", "escape", "forceescape", "safe")})
    items = {name: _items_in(jf.FILTERS[name], 1) for name in ("sort", "unique", "groupby")}
    items["dictsort"] = _items_in(jf.FILTERS["dictsort"])
    items["groupby"] = _groups(items["groupby"])
    return {
        **text,
        **items,
        "xmlattr": _measured(jf.FILTERS["xmlattr"], 1),
        "urlencode": _measured(jf.FILTERS["urlencode"]),
        "pprint": _pprint,
        "tojson": _tojson,
        "join": _join,
        "replace": _replace,
        "format": _format,
        "center": _center,
        "indent": _indent,
        "wordwrap": _wordwrap,
        "truncate": _truncate,
        "list": _list,
        "reverse": _reverse,
        "batch": _batch,
        "slice": _slice,
        "sum": _sum,
        "urlize": _urlize,
    }
