"""How long a model stays loaded after a request (Ollama's `keep_alive`), and which models never leave.

`keep_alive` is a request field (or the router's `--keep-alive`, or a preset's `keep-alive`): seconds as a
number, or an Ollama duration (`"30s"`, `"5m"`, `"1h30m"`, `"250ms"`); 0 unloads the model as soon as its
last request ends, a negative value keeps it loaded (until the LRU eviction of `--models-max` needs its
place, as without keep-alive). An administrator's `--keep-alive-max` bounds every value, "forever"
included. A preset's `pin = true` keeps a model loaded: never unloaded by keep-alive, never evicted.
"""

from __future__ import annotations

import re

__all__ = ["KeepAliveError", "effective_keep_alive", "parse_keep_alive"]

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class KeepAliveError(ValueError):
    """A keep_alive value that is neither a number of seconds nor a duration."""


def parse_keep_alive(value: object) -> float:
    """Seconds (negative: forever)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise KeepAliveError("'keep_alive' must be a number of seconds or a duration such as \"5m\"")
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            raise KeepAliveError("'keep_alive' must be finite")
        return float(value)
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)  # a bare number: seconds
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _PART.finditer(body):
        if m.start() != pos:
            break
        total += float(m[1]) * _UNITS[m[2]]
        pos = m.end()
    if not body or pos != len(body):
        raise KeepAliveError(f'\'keep_alive\' {value!r} is not a duration (such as "30s", "5m", "1h")')
    return sign * total


def effective_keep_alive(requested: float | None, default: float, maximum: float) -> float:
    """The keep-alive applied: the request's, else the default; never beyond the maximum (< 0: none)."""
    keep = default if requested is None else requested
    if maximum >= 0 and (keep < 0 or keep > maximum):
        return maximum
    return keep
