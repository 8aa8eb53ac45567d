"""llama-server's RoPE scaling flags: `--rope-scaling`, `--rope-scale`, `--rope-freq-scale`, `--yarn-*`.

Each given flag becomes the model metadata key llama.cpp reads for it (`<arch>.rope.scaling.type`,
`.factor`, `.original_context_length`, `.yarn_ext_factor`, `.yarn_attn_factor`, `.yarn_beta_fast`,
`.yarn_beta_slow`), appended to the `--override-kv` entries: the engine resolves them as llama.cpp resolves
its context parameters over the model's values (llama_engine.arch.rope_scaling). Flags not given leave
the model's own values (its GGUF rope scaling metadata) in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from gguf_io import GGUFError
from gguf_io import open as open_gguf

__all__ = ["rope_options", "rope_overrides"]

_YARN = (  # flag, env, metadata key after "<arch>.rope.scaling."
    ("--yarn-ext-factor", "LLAMA_ARG_YARN_EXT_FACTOR", "yarn_ext_factor"),
    ("--yarn-attn-factor", "LLAMA_ARG_YARN_ATTN_FACTOR", "yarn_attn_factor"),
    ("--yarn-beta-slow", "LLAMA_ARG_YARN_BETA_SLOW", "yarn_beta_slow"),
    ("--yarn-beta-fast", "LLAMA_ARG_YARN_BETA_FAST", "yarn_beta_fast"),
)


def rope_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The click options (llama.cpp's names and environment variables)."""
    options = [
        click.option(
            "--rope-scaling",
            type=click.Choice(["none", "linear", "yarn"]),
            envvar="LLAMA_ARG_ROPE_SCALING_TYPE",
            help="RoPE frequency scaling method (default: the model's).",
        ),
        click.option(
            "--rope-scale", type=float, envvar="LLAMA_ARG_ROPE_SCALE", help="Context scaling factor N."
        ),
        click.option(
            "--rope-freq-scale", type=float, envvar="LLAMA_ARG_ROPE_FREQ_SCALE", help="Frequency scale (1/N)."
        ),
        click.option(
            "--yarn-orig-ctx", type=int, envvar="LLAMA_ARG_YARN_ORIG_CTX", help="YaRN original context size."
        ),
        *(click.option(flag, type=float, envvar=env) for flag, env, _ in _YARN),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _keys(kw: dict[str, Any]) -> list[tuple[str, Any]]:
    """(key after `<arch>.rope.scaling.`, value) for each flag given."""
    out: list[tuple[str, Any]] = []
    if kw.get("rope_scaling"):
        out.append(("type", kw["rope_scaling"]))
    factor = kw.get("rope_scale")
    if kw.get("rope_freq_scale"):  # llama.cpp: both set freq_scale; this one is parsed later
        factor = 1.0 / kw["rope_freq_scale"]
    if factor:
        if factor < 0:
            raise click.UsageError("--rope-scale / --rope-freq-scale must be positive")
        out.append(("factor", float(factor)))
    if kw.get("yarn_orig_ctx"):
        out.append(("original_context_length", int(kw["yarn_orig_ctx"])))
    for flag, _, key in _YARN:
        value = kw.get(flag[2:].replace("-", "_"))
        if value is not None and value >= 0:  # negative: llama.cpp's "not set"
            out.append((key, float(value)))
    return out


def rope_overrides(kw: dict[str, Any], model: str) -> tuple[tuple[str, Any], ...]:
    """The metadata overrides the given flags stand for, with the model's architecture prefix."""
    keys = _keys(kw)
    if not keys:
        return ()
    try:
        arch = open_gguf(model).header.architecture
    except GGUFError as e:
        raise click.UsageError(str(e)) from None
    return tuple((f"{arch}.rope.scaling.{k}", v) for k, v in keys)
