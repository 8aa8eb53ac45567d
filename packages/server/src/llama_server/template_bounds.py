"""Size bounds on what a chat template builds while it renders.

The sandbox keeps a template away from Python's internals but lets it allocate: `'x' * n`, a join of a list
that holds one long string millions of times, `s.replace('', s)`, a string doubled in a loop with `~`. A
render deadline cannot stop one huge allocation, so every operation that builds a string or a list is
bounded where the value is built:

- no string longer than `MAX_CHARS` (4 Mi characters, the output cap) and no list longer than `MAX_ITEMS`
  (256 Ki items). An operation whose result can outgrow its inputs (repetition, concatenation, `join`,
  `replace`, formatting, padding, indenting, wrapping, turning a list into text) computes the result's
  size from its inputs and is refused before it allocates. One whose result is at most a small multiple of
  its input (case mapping, escaping, JSON of a value already measured) is checked as soon as it is built.
- what a render has built and still holds stays under `MAX_LIVE_BYTES` (32 MiB, as `sys.getsizeof` counts
  them), so a loop that keeps what it builds (appending to a list, one variable after another) stops
  there. Every string and list built is held in a table with its size; when the table reaches
  `MAX_RENDER_BYTES` (64 MiB) the objects only the table still holds (those the template dropped: the
  previous value of an accumulator such as `ns.out = ns.out ~ text`) are let go, and what remains must
  fit `MAX_LIVE_BYTES`. Templates that build their prompt by accumulation therefore cost what they hold,
  not the sum of every intermediate value.

Numbers are bounded too: an integer product or power over `MAX_INT_BITS` is refused.
"""

from __future__ import annotations

import itertools
import re
import string
import sys
import threading
from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, Sized, ValuesView
from contextlib import contextmanager
from typing import Any

import jinja2

__all__ = [
    "MAX_CHARS",
    "MAX_INT_BITS",
    "MAX_ITEMS",
    "MAX_LIVE_BYTES",
    "MAX_RENDER_BYTES",
    "TemplateError",
    "built",
    "check_binop",
    "check_chars",
    "check_format",
    "check_items",
    "check_percent",
    "concat_chunks",
    "concat_operands",
    "held_bytes",
    "join_text",
    "metered",
    "replace_text",
    "str_method",
    "take",
    "text_size",
    "to_text",
]

MAX_CHARS = 4 * 1024 * 1024
MAX_ITEMS = 256 * 1024
MAX_RENDER_BYTES = 64 * 1024 * 1024
MAX_LIVE_BYTES = 32 * 1024 * 1024
# what tracking one object costs the table itself (a dict slot and a tuple), counted with the object
_ENTRY_BYTES = 100
# sys.getrefcount of an object only the table holds: the table's tuple and the call's own argument
_ORPHAN_REFS = 2
MAX_INT_BITS = 1 << 16
TOO_LARGE = "the template's output is too large"
# what str.splitlines and str.split() split on (every str.isspace character is below U+3001)
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
WHITESPACE = "".join(c for c in map(chr, range(0x3001)) if c.isspace())
_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(\*|\d*)(?:\.(\*|\d*))?")


class TemplateError(Exception):
    """The template failed, ran too long or produced too much text."""


_meter = threading.local()


@contextmanager
def metered() -> Iterator[None]:
    """Hold and count what the render on this thread builds (see `MAX_LIVE_BYTES`)."""
    _meter.held = {}
    _meter.total = 0
    _meter.on = True
    try:
        yield
    finally:
        _meter.on = False
        _meter.held = {}


def held_bytes() -> int:
    """Bytes the table of the render on this thread holds (the last render's, once it ended)."""
    return getattr(_meter, "total", 0)  # type: ignore[no-any-return]


def _hold(value: Any, nbytes: int) -> None:
    if not getattr(_meter, "on", False) or id(value) in _meter.held:
        return
    _meter.held[id(value)] = (value, nbytes)
    _meter.total += nbytes + _ENTRY_BYTES
    if _meter.total > MAX_RENDER_BYTES:
        _sweep()


def _sweep() -> None:
    """Let go of what only the table still holds (Python would have freed it), then check what is left."""
    held = _meter.held
    dropped = [key for key, entry in held.items() if sys.getrefcount(entry[0]) <= _ORPHAN_REFS]
    for key in dropped:
        _meter.total -= held.pop(key)[1] + _ENTRY_BYTES
    if _meter.total > MAX_LIVE_BYTES:
        raise TemplateError(f"the chat template holds more than {MAX_LIVE_BYTES >> 20} MiB of text and lists")


def check_chars(n: int) -> None:
    """Refuse a string of `n` characters before it is built."""
    if n > MAX_CHARS:
        raise TemplateError(TOO_LARGE)


def check_items(n: int) -> None:
    """Refuse a list of `n` items before it is built."""
    if n > MAX_ITEMS:
        raise TemplateError(f"the chat template built a list longer than {MAX_ITEMS} items")


def built(value: Any, pieces: bool = False) -> Any:
    """A string or list the template has just built: refused if too large, else counted. `pieces`: the
    list's items are new strings (a split) and are held one by one."""
    if isinstance(value, str):
        check_chars(len(value))
        _hold(value, sys.getsizeof(value))
    elif isinstance(value, list | tuple | dict):
        check_items(len(value))
        if pieces:
            for piece in value:
                _hold(piece, sys.getsizeof(piece))
        _hold(value, _container_bytes(value))
    return value


def _container_bytes(value: list[Any] | tuple[Any, ...] | dict[Any, Any]) -> int:
    """What a container just built costs: itself and the items (keys and values) it holds that nothing in
    the table accounts for yet (the pairs of `|items`, the groups of `|batch`, a copied dict's keys)."""
    if not getattr(_meter, "on", False) or id(value) in _meter.held:
        return 0
    held = _meter.held
    items: Iterable[Any] = itertools.chain(value.keys(), value.values()) if isinstance(value, dict) else value
    return sys.getsizeof(value) + sum(sys.getsizeof(v) for v in items if id(v) not in held)


def text_size(value: Any, indent: int = 0, limit: int = MAX_CHARS) -> int:
    """About `len(str(value))` (or of its JSON or pprint with `indent` per nesting level), counting every
    reference to a shared string again; the walk stops once over `limit`, so it is cheap for huge values."""
    total = 0
    stack: list[tuple[Iterator[Any], int]] = [(iter((value,)), 0)]
    while stack:
        it, depth = stack[-1]
        v = next(it, stack)
        if v is stack:
            stack.pop()
            continue
        if isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, bool) or v is None:
            total += 5
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 2
        elif isinstance(v, float | jinja2.Undefined):
            total += 24
        elif isinstance(v, jinja2.utils.Namespace):
            total += 12
            stack.append((iter(v._Namespace__attrs.items()), depth))  # type: ignore[attr-defined]
        elif isinstance(v, Mapping | list | tuple | set | frozenset | KeysView | ValuesView | ItemsView):
            total += 2 + len(v) * (4 + indent * (depth + 1))
            stack.append((iter(v.items() if isinstance(v, Mapping) else v), depth + 1))
        else:
            total += 128
        if total > limit:
            break
    return total


def to_text(value: Any) -> str:
    """`str(value)`, refused before it is built when `value` is a container whose text is too large."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, int | float | jinja2.Undefined):
        return str(value)
    check_chars(text_size(value))
    return built(str(value))  # type: ignore[no-any-return]


def take(value: Any) -> Any:
    """`value` itself when it has a length within bounds, else its items (at most `MAX_ITEMS`) as a list."""
    if isinstance(value, Sized):
        check_items(len(value))
        return value
    items = list(itertools.islice(iter(value), MAX_ITEMS + 1))
    check_items(len(items))
    return items


def join_text(sep: str, items: Iterable[Any], convert: bool) -> str:
    """`sep.join(items)`, sized first; `convert`: items are turned into text (the `join` filter)."""
    parts = take(items)
    if not isinstance(parts, list | tuple):
        parts = list(parts)
    if convert and not set(map(type, parts)) <= {str}:
        texts, size = [], 0
        for p in parts:
            texts.append(to_text(p))
            size += len(texts[-1]) + len(sep)
            check_chars(size)
        parts = texts
    check_chars(sum(map(len, parts)) + len(sep) * max(len(parts) - 1, 0))
    return built(sep.join(parts))  # type: ignore[no-any-return]


def concat_chunks(chunks: Iterable[str]) -> str:
    """The environment's `concat`: a macro's, a `{% set %}` block's or a `{% filter %}` block's output."""
    parts = chunks if isinstance(chunks, list) else list(chunks)
    check_chars(sum(map(len, parts)))
    return built("".join(parts))  # type: ignore[no-any-return]


def concat_operands(join: Callable[[Iterable[Any]], str], operands: tuple[Any, ...]) -> str:
    """The `~` operator over its operands (Jinja compiles `a ~ b ~ c` into one join)."""
    texts = tuple(map(to_text, operands))
    check_chars(sum(map(len, texts)))
    return built(join(texts))  # type: ignore[no-any-return]


def replace_text(s: str, old: str, new: str, count: int = -1) -> str:
    """`s.replace(old, new, count)`, sized first (an empty `old` matches between every two characters)."""
    n = s.count(old)
    if count >= 0:
        n = min(n, count)
    check_chars(len(s) + n * (len(new) - len(old)))
    return built(s.replace(old, new, count))  # type: ignore[no-any-return]


def check_percent(fmt: str, args: Any) -> None:
    """Refuse `fmt % args` when its widths or its size (every field holding the largest argument) are too
    large."""
    fields = _PERCENT_FIELD.findall(fmt)
    if any("*" in w + p or len(w) > 6 or len(p) > 6 for w, p in fields):
        raise TemplateError("format width too large in the template")
    values = args.values() if isinstance(args, Mapping) else args if isinstance(args, tuple) else (args,)
    biggest = max((text_size(v) for v in values), default=0)
    widths = sum(int(w or 0) + int(p or 0) for w, p in fields)
    check_chars(len(fmt) + widths + len(fields) * biggest)


def check_format(fmt: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Refuse `fmt.format(...)` when its size (every field holding the largest argument) is too large."""
    n = sum(1 for _, name, _, _ in string.Formatter().parse(fmt) if name is not None)
    biggest = max((text_size(v) for v in (*args, *kwargs.values())), default=0)
    check_chars(len(fmt) + n * (biggest + 1000))


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse `left <operator> right` before it is computed when its result would be too large."""
    if operator == "+":
        if isinstance(left, str) and isinstance(right, str):
            check_chars(len(left) + len(right))
        elif isinstance(left, list | tuple) and isinstance(right, list | tuple):
            check_items(len(left) + len(right))
    elif operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(n, int) and isinstance(seq, str):
                check_chars(len(seq) * n)
            elif isinstance(n, int) and isinstance(seq, list | tuple):
                check_items(len(seq) * n)
        if (
            isinstance(left, int)
            and isinstance(right, int)
            and left.bit_length() + right.bit_length() > MAX_INT_BITS
        ):
            raise TemplateError("number too large in the template")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int):
        if abs(right) > 1024 or left.bit_length() * right > MAX_INT_BITS:
            raise TemplateError("exponent too large in the template")
    elif operator == "%" and isinstance(left, str):
        check_percent(left, right)


def _check_pad(s: str, width: Any, *_: Any) -> None:
    if isinstance(width, int):
        check_chars(width)


def _check_expandtabs(s: str, tabsize: Any = 8) -> None:
    if isinstance(tabsize, int):
        check_chars(len(s) + s.count("\t") * max(tabsize, 0))


def _check_translate(s: str, table: Any) -> None:
    values = table.values() if isinstance(table, Mapping) else table
    if not isinstance(values, list | tuple | ValuesView):
        raise TemplateError("str.translate needs a dict or list table in chat templates")
    check_chars(len(s) * max((len(v) for v in values if isinstance(v, str)), default=1))


def _check_split(s: str, sep: Any = None, maxsplit: Any = -1) -> None:
    n = s.count(sep) if isinstance(sep, str) and sep else sum(map(s.count, WHITESPACE))
    if isinstance(maxsplit, int) and maxsplit >= 0:
        n = min(n, maxsplit)
    check_items(n + 1)


def _check_splitlines(s: str, *_: Any, **__: Any) -> None:
    check_items(sum(map(s.count, LINE_BREAKS)) + 1)


def _check_replace(s: str, old: Any, new: Any, count: Any = -1) -> None:
    if isinstance(old, str) and isinstance(new, str) and isinstance(count, int):
        n = min(s.count(old), count) if count >= 0 else s.count(old)
        check_chars(len(s) + n * (len(new) - len(old)))


# str methods whose result can outgrow the string: what sizes them before they run
_STR_CHECKS: dict[str, Callable[..., None]] = {
    "center": _check_pad,
    "ljust": _check_pad,
    "rjust": _check_pad,
    "zfill": _check_pad,
    "expandtabs": _check_expandtabs,
    "translate": _check_translate,
    "replace": _check_replace,
    "split": _check_split,
    "rsplit": _check_split,
    "splitlines": _check_splitlines,
}


def str_method(method: Any) -> Callable[..., Any]:
    """A str method as a template may call it: sized before it runs when it can grow (`join` sizes its
    items), and what it returns counted."""
    owner: str = method.__self__
    name: str = method.__name__
    if name == "join":
        return lambda items: join_text(owner, items, convert=False)
    check = _STR_CHECKS.get(name)

    def bounded(*args: Any, **kwargs: Any) -> Any:
        if check is not None:
            check(owner, *args, **kwargs)
        result = method(*args, **kwargs)
        return result if result is owner else built(result, pieces=isinstance(result, list | tuple))

    return bounded
