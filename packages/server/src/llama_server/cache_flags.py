"""`llama-server`'s prompt cache flags (cli.md §1.2, §1.3): click options and the engine's config.

`-ctxcp/--ctx-checkpoints/--swa-checkpoints N` (per slot, 0: none), `-cms/--checkpoint-min-step N`
(spacing, ≥ 0), `--cache-reuse N` (the default `n_cache_reuse`), `-cram/--cache-ram N` and
`--cache-idle-slots` (the host-RAM prompt cache), with llama.cpp's defaults and LLAMA_ARG_* variables;
`checkpoint_config` builds the engine's `CheckpointConfig`, `cache_ram` the RAM cache settings.
"""

from __future__ import annotations

import logging
from typing import Any

import click

from llama_engine.checkpoints import CheckpointConfig

__all__ = ["cache_options", "cache_ram", "checkpoint_config"]

log = logging.getLogger("llama_server")


def cache_options(f: Any) -> Any:
    """Add the checkpoint flags to a click command."""
    o = click.option
    for option in (
        o(
            "-ctxcp",
            "--ctx-checkpoints",
            "--swa-checkpoints",
            "ctx_checkpoints",
            type=int,
            default=32,
            envvar="LLAMA_ARG_CTX_CHECKPOINTS",
            show_default=True,
            help="Max context checkpoints per slot (sliding-window models; 0: none).",
        ),
        o(
            "-cms",
            "--checkpoint-min-step",
            "checkpoint_min_step",
            type=int,
            default=8192,
            envvar="LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT",
            show_default=True,
            help="Minimum spacing between context checkpoints in tokens (0: no minimum).",
        ),
        o(
            "--cache-reuse",
            "cache_reuse",
            type=click.IntRange(min=0),
            default=0,
            envvar="LLAMA_ARG_CACHE_REUSE",
            show_default=True,
            help="Min chunk size reused from the cache by KV shifting (default n_cache_reuse; 0: off).",
        ),
        o(
            "-cram",
            "--cache-ram",
            "cache_ram",
            type=int,
            default=8192,
            envvar="LLAMA_ARG_CACHE_RAM",
            show_default=True,
            help="Host-RAM prompt cache size in MiB (-1: no limit, 0: off).",
        ),
        o(
            "--cache-idle-slots/--no-cache-idle-slots",
            "cache_idle_slots",
            default=True,
            envvar="LLAMA_ARG_CACHE_IDLE_SLOTS",
            help="Save idle slots to the prompt cache when a task starts (cleared with a unified KV cache).",
        ),
    ):
        f = option(f)
    return f


def checkpoint_config(kw: dict[str, Any]) -> CheckpointConfig:
    """The engine's checkpoint settings from the parsed flags (click.UsageError when invalid)."""
    if kw["checkpoint_min_step"] < 0:
        raise click.UsageError("checkpoint-min-step must be non-negative")
    return CheckpointConfig(n_max=max(kw["ctx_checkpoints"], 0), min_step=kw["checkpoint_min_step"])


def cache_ram(kw: dict[str, Any]) -> tuple[int, bool]:
    """(RAM cache MiB, save idle slots): idle slots need the RAM cache, as in llama-server."""
    idle = kw["cache_idle_slots"]
    if idle and kw["cache_ram"] == 0:
        log.warning("--cache-idle-slots requires --cache-ram, disabling")
        idle = False
    return kw["cache_ram"], idle
