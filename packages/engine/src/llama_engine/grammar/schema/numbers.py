"""Bounded JSON numbers (`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` on type number),
which llama.cpp's converter ignores.

A number is written as an integer part, an optional fraction and no exponent; a fractional bound is
rounded inwards to an integer (so the grammar allows a subset of the range). For a magnitude range
[a, b]: integer parts a..b-1 take any fraction, b takes only a zero fraction, an exclusive a takes a
non-zero fraction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .rules import INT64_MAX, SchemaError, min_max_int

__all__ = ["number_range"]

_MAX_DIGITS = 15
_ANY_FRAC = ' ("." decimal-part)?'
_ZERO_FRAC = ' ("." "0"{1,16})?'
_NONZERO_FRAC = ' "." [0-9]{0,15} [1-9]'

Bound = tuple[int, bool]  # (integer value, exclusive)


def _bound(s: dict[str, Any], low: bool) -> Bound | None:
    """The tighter of the inclusive and the exclusive bound on one side, as an integer."""
    inc_key, exc_key = ("minimum", "exclusiveMinimum") if low else ("maximum", "exclusiveMaximum")
    out: Bound | None = None
    for key in (inc_key, exc_key):
        v = s.get(key)
        if v is None or isinstance(v, bool):
            continue
        if not isinstance(v, int | float) or not math.isfinite(v):
            raise SchemaError(f"{key} must be a number")
        exclusive = key == exc_key or s.get(exc_key) is True
        if not float(v).is_integer():  # round inwards: the rounded bound is inclusive
            v, exclusive = (math.ceil(v) if low else math.floor(v)), False
        b = (int(v), exclusive)
        if abs(b[0]) >= 10**_MAX_DIGITS:
            raise SchemaError(f"{key} {s[key]} has more than {_MAX_DIGITS} digits")
        if out is None or (b[0] > out[0] if low else b[0] < out[0]) or (b[0] == out[0] and b[1]):
            out = b
    return out


def _magnitudes(a: int, a_excl: bool, b: int | None, b_excl: bool) -> list[str]:
    """Alternatives for a non-negative magnitude in the range a..b (b None: unbounded)."""
    alts: list[str] = []
    if b is None:
        low = a + 1 if a_excl else a
        alts.append(f"({min_max_int(low, INT64_MAX)}){_ANY_FRAC}")
    elif a == b:
        if not a_excl and not b_excl:
            alts.append(f'"{a}"{_ZERO_FRAC}')
        return alts
    elif a < b:
        low, high = (a + 1 if a_excl else a), b - 1
        if low <= high:
            alts.append(f"({min_max_int(low, high)}){_ANY_FRAC}")
        if not b_excl:
            alts.append(f'"{b}"{_ZERO_FRAC}')
    if a_excl and (b is None or a < b):
        alts.append(f'"{a}"{_NONZERO_FRAC}')
    return alts


def number_range(s: dict[str, Any], add_primitive: Callable[[str, str], str]) -> str:
    """The rule text for a bounded number schema `s`."""
    lo, hi = _bound(s, True), _bound(s, False)
    alts: list[str] = []
    if lo is None or lo[0] < 0:
        # negative values: magnitudes in (0 or -hi) .. -lo, "0" itself is on the positive side
        if hi is not None and hi[0] < 0:
            neg = _magnitudes(-hi[0], hi[1], None if lo is None else -lo[0], lo[1] if lo else False)
        else:
            neg = _magnitudes(0, True, None if lo is None else -lo[0], lo[1] if lo else False)
        alts += [f'"-" {m}' for m in neg]
    if hi is None or hi[0] >= 0:
        a, a_excl = (0, False) if lo is None or lo[0] < 0 else lo
        alts += _magnitudes(a, a_excl, None if hi is None else hi[0], hi[1] if hi else False)
    if not alts:
        raise SchemaError("no number lies between the schema's bounds")
    add_primitive("decimal-part", "decimal-part")
    return "(" + " | ".join(alts) + ")"
