"""The values of llama-server's flags: booleans, KV cache types, API keys, logit biases, `--override-kv`,
`--reasoning`, escapes in prompts and the sampler order, each checked with a message naming the flag."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from llama_engine.kv_cache import KV_TYPES
from llama_engine.kv_types import flash_attn_mode

from .model_overrides import parse_override_kv
from .schemas import MAX_BIAS

__all__ = [
    "api_keys",
    "cache_type",
    "env_bool",
    "flash_attn_value",
    "logit_bias",
    "override_kv",
    "reasoning_mode",
    "samplers_kw",
    "unescape",
]

_TRUE, _FALSE = ("true", "1", "on", "enabled"), ("false", "0", "off", "disabled")
_BOOL = dict.fromkeys(_TRUE, True) | dict.fromkeys(_FALSE, False)


def env_bool(value: str) -> bool:
    v = value.strip().lower()
    if v not in _BOOL:
        raise click.BadParameter(f"not a boolean: {value!r}")
    return _BOOL[v]


def cache_type(name: str, flag: str) -> str:
    """llama.cpp's KV cache type names (common/arg.cpp kv_cache_types)."""
    if name not in KV_TYPES:
        raise click.BadParameter(
            f"Unsupported cache type: {name} (allowed values: {', '.join(KV_TYPES)})", param_hint=flag
        )
    return name


def flash_attn_value(value: str, cache_type_v: str) -> str:
    """-fa on|off|auto with llama.cpp's spellings (is_truthy / is_falsey / is_autoy); a quantized V cache
    with flash attention off is llama.cpp's start-up error."""
    fa = flash_attn_mode(value)
    if fa is None:
        raise click.BadParameter(
            f"error: unknown value for --flash-attn: '{value}'", param_hint="--flash-attn"
        )
    if fa == "off" and cache_type_v in KV_TYPES and KV_TYPES[cache_type_v].quantized:
        raise click.UsageError("quantized V cache requires flash_attn to be enabled (-fa on or auto)")
    return fa


def api_keys(api_key: str | None, api_key_file: str | None) -> tuple[str, ...]:
    keys = [k for k in (api_key or "").split(",") if k]
    if api_key_file:
        for line in Path(api_key_file).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    return tuple(keys)


def logit_bias(entries: tuple[str, ...]) -> tuple[tuple[int, float], ...]:
    out = []
    for e in entries:
        for sep in ("+", "-"):
            i = e.find(sep, 1)
            if i > 0:
                try:
                    token, bias = int(e[:i]), float(e[i:])
                except ValueError:
                    raise click.BadParameter(f"invalid logit bias {e!r}") from None
                if not (abs(bias) <= MAX_BIAS or bias == -math.inf):  # -inf bans the token; NaN fails
                    raise click.BadParameter(
                        f"logit bias {e!r}: a bias is -inf (a ban) or finite within ±{MAX_BIAS:g}"
                    )
                out.append((token, bias))
                break
        else:
            raise click.BadParameter(f"invalid logit bias {e!r} (expected TOKEN+BIAS or TOKEN-BIAS)")
    return tuple(out)


def override_kv(entries: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    try:
        return tuple(parse_override_kv(e) for e in entries)
    except ValueError as e:
        raise click.UsageError(f"--override-kv: {e}") from None


def reasoning_mode(value: str, budget: int) -> str:
    """`-rea on|off|auto` (llama.cpp's truthy and falsy spellings too). A budget of 0 no longer turns
    thinking off: as llama.cpp now does, the block opens and is closed at once (reasoning_budget.py)."""
    v = value.strip().lower()
    mode = "on" if v in _TRUE else "off" if v in _FALSE else "auto" if v == "auto" else None
    if mode is None:
        raise click.UsageError(f"error: unknown value for --reasoning: '{value}'")
    return mode


def unescape(s: str) -> str:
    return (
        s.replace("\\n", "\n")
        .replace("\\r", "\r")
        .replace("\\t", "\t")
        .replace("\\'", "'")
        .replace('\\"', '"')
        .replace("\\\\", "\\")
    )


def samplers_kw(samplers: tuple[str, ...] | None) -> dict[str, Any]:
    """The `samplers` keyword for SamplingParams, only when the user set an order."""
    return {} if samplers is None else {"samplers": samplers}
