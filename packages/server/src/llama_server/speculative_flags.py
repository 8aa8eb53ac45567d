"""`llama-server`'s speculative decoding flags (cli.md §1.9): click options and the engine's config.

`spec_options` adds every `--spec-*` flag (with llama.cpp's aliases and LLAMA_ARG_* variables), the
lookup-cache files `-lcs/-lcd`, and the removed `--draft*` flags, which fail naming their replacement.
Placement flags of the draft model (devices, GPU layers, CPU masks, tensor overrides) are accepted and
have no effect. `build_spec_config` turns the parsed values into a `SpeculativeConfig`; `spec_counters`
and `spec_per_position` are the `/metrics` lines.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from llama_engine.kv_cache import KV_TYPES
from llama_engine.speculative import (
    DraftParams,
    NgramMapParams,
    NgramModParams,
    SpecType,
    SpeculativeConfig,
    parse_spec_types,
    spec_type_names,
)

__all__ = ["build_spec_config", "spec_counters", "spec_options", "spec_per_position"]

# removed flags: (names, env, the replacement llama.cpp names)
_REMOVED = [
    (
        ("--draft", "--draft-n", "--draft-max"),
        "LLAMA_ARG_DRAFT_MAX",
        "use --spec-draft-n-max or --spec-ngram-mod-n-max",
    ),
    (
        ("--draft-min", "--draft-n-min"),
        "LLAMA_ARG_DRAFT_MIN",
        "use --spec-draft-n-min or --spec-ngram-mod-n-min",
    ),
    (("--spec-ngram-size-n",), None, "use the respective --spec-ngram-*-size-n"),
    (("--spec-ngram-size-m",), None, "use the respective --spec-ngram-*-size-m"),
    (("--spec-ngram-min-hits",), None, "use the respective --spec-ngram-*-min-hits"),
]

# draft placement flags with no meaning on this CPU-only engine: (names, takes a value)
_PLACEMENT = [
    (("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"), True),
    (("--spec-draft-device", "-devd", "--device-draft"), True),
    (("--spec-draft-threads-batch", "-tbd", "--threads-batch-draft"), True),
    (("--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft"), True),
    (("--spec-draft-cpu-range", "-Crd", "--cpu-range-draft"), True),
    (("--spec-draft-cpu-strict", "--cpu-strict-draft"), True),
    (("--spec-draft-prio", "--prio-draft"), True),
    (("--spec-draft-poll", "--poll-draft"), True),
    (("--spec-draft-cpu-mask-batch", "-Cbd", "--cpu-mask-batch-draft"), True),
    (("--spec-draft-cpu-range-batch", "-Crbd", "--cpu-range-batch-draft"), True),
    (("--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"), True),
    (("--spec-draft-prio-batch", "--prio-batch-draft"), True),
    (("--spec-draft-poll-batch", "--poll-batch-draft"), True),
    (("--spec-draft-override-tensor", "-otd", "--override-tensor-draft"), True),
    (("--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"), False),
    (("--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft"), True),
]

_NGRAM_MAPS = ("simple", "map-k", "map-k4v")


def _removed(message: str) -> Any:
    def fail(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None:
            raise click.BadParameter(f"the argument has been removed. {message}", ctx, param)

    return fail


def _int_in(lo: int, hi: int, what: str) -> Any:
    def check(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
        if value is not None and not lo <= value <= hi:
            raise click.BadParameter(what, ctx, param)
        return value

    return check


def spec_options(f: Any) -> Any:
    """Add the speculative decoding options to a click command."""
    o = click.option
    opts = [
        o(
            "--spec-type",
            "spec_type",
            multiple=True,
            envvar="LLAMA_ARG_SPEC_TYPE",
            help=f"Comma-separated speculative types: {spec_type_names()} (default: none).",
        ),
        o(
            "--spec-draft-model",
            "-md",
            "--model-draft",
            "spec_draft_model",
            envvar="LLAMA_ARG_SPEC_DRAFT_MODEL",
            help="Draft model for draft-simple.",
        ),
        o(
            "--spec-draft-hf",
            "-hfd",
            "-hfrd",
            "--hf-repo-draft",
            "spec_draft_hf",
            envvar="LLAMA_ARG_SPEC_DRAFT_HF_REPO",
            hidden=True,
        ),
        o(
            "--spec-draft-n-max",
            "spec_draft_n_max",
            type=int,
            default=3,
            envvar="LLAMA_ARG_SPEC_DRAFT_N_MAX",
            callback=_int_in(0, 2**31 - 1, "invalid value"),
            show_default=True,
            help="Tokens drafted per step.",
        ),
        o(
            "--spec-draft-n-min",
            "spec_draft_n_min",
            type=int,
            default=0,
            envvar="LLAMA_ARG_SPEC_DRAFT_N_MIN",
            show_default=True,
            help="Minimum drafted tokens (else no draft).",
        ),
        o(
            "--spec-draft-p-min",
            "--draft-p-min",
            "spec_draft_p_min",
            type=float,
            default=0.0,
            envvar="LLAMA_ARG_SPEC_DRAFT_P_MIN",
            show_default=True,
            help="Minimum draft probability (greedy).",
        ),
        o(
            "--spec-draft-p-split",
            "--draft-p-split",
            "spec_draft_p_split",
            type=float,
            default=0.1,
            envvar="LLAMA_ARG_SPEC_DRAFT_P_SPLIT",
            show_default=True,
        ),
        o(
            "--spec-draft-sampling",
            "spec_draft_sampling",
            default="greedy",
            envvar="LLAMA_ARG_SPEC_DRAFT_SAMPLING",
            help="greedy (argmax, sample-and-match) or probabilistic (rejection sampling).",
        ),
        o(
            "--spec-draft-backend-sampling/--no-spec-draft-backend-sampling",
            "spec_draft_backend_sampling",
            default=True,
            envvar="LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING",
            hidden=True,
        ),
        o(
            "--spec-draft-type-k",
            "-ctkd",
            "--cache-type-k-draft",
            "spec_draft_type_k",
            default="f16",
            envvar="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K",
            help="Draft KV cache type for K.",
        ),
        o(
            "--spec-draft-type-v",
            "-ctvd",
            "--cache-type-v-draft",
            "spec_draft_type_v",
            default="f16",
            envvar="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V",
            help="Draft KV cache type for V.",
        ),
        o("--spec-draft-threads", "-td", "--threads-draft", "spec_draft_threads", type=int, hidden=True),
        o(
            "--spec-ngram-mod-n-min",
            "spec_ngram_mod_n_min",
            type=int,
            default=48,
            callback=_int_in(0, 1024, "ngram n-min must be between 0 and 1024 inclusive"),
        ),
        o(
            "--spec-ngram-mod-n-max",
            "spec_ngram_mod_n_max",
            type=int,
            default=64,
            callback=_int_in(0, 1024, "ngram n-max must be between 0 and 1024 inclusive"),
        ),
        o(
            "--spec-ngram-mod-n-match",
            "spec_ngram_mod_n_match",
            type=int,
            default=24,
            callback=_int_in(1, 1024, "ngram size N must be between 1 and 1024 inclusive"),
        ),
        o(
            "-lcs",
            "--lookup-cache-static",
            "spec_lookup_cache_static",
            type=click.Path(dir_okay=False),
            help="Static lookup cache for ngram-cache (read only).",
        ),
        o(
            "-lcd",
            "--lookup-cache-dynamic",
            "spec_lookup_cache_dynamic",
            type=click.Path(dir_okay=False),
            help="Dynamic lookup cache for ngram-cache (read at start, written at shutdown).",
        ),
        o(
            "--spec-synth-len",
            "spec_synth_len",
            envvar="LLAMA_ARG_SPEC_SYNTH_LEN",
            help="Synthetic mean acceptance length (benchmarking only).",
        ),
        o(
            "--spec-synth-rates",
            "spec_synth_rates",
            envvar="LLAMA_ARG_SPEC_SYNTH_RATES",
            help="Synthetic per-position acceptance rates P0,P1,... (benchmarking only).",
        ),
        o("--spec-default", "spec_default", is_flag=True, help="The default speculative config (ngram-mod)."),
        o(
            "--spec-adaptive/--no-spec-adaptive",
            "spec_adaptive",
            default=True,
            envvar="LLAMA_ARG_SPEC_ADAPTIVE",
            show_default=True,
            help="Shorten, then pause, a slot's drafts after rejections (off: n-max at every step).",
        ),
    ]
    for kind in _NGRAM_MAPS:
        key = "spec_ngram_" + kind.replace("-", "_")
        opts += [
            o(
                f"--spec-ngram-{kind}-size-n",
                key + "_size_n",
                type=int,
                default=12,
                callback=_int_in(1, 1024, "ngram size N must be between 1 and 1024 inclusive"),
            ),
            o(
                f"--spec-ngram-{kind}-size-m",
                key + "_size_m",
                type=int,
                default=48,
                callback=_int_in(1, 1024, "ngram size M must be between 1 and 1024 inclusive"),
            ),
            o(
                f"--spec-ngram-{kind}-min-hits",
                key + "_min_hits",
                type=int,
                default=1,
                callback=_int_in(1, 2**31 - 1, "ngram min hits must be at least 1"),
            ),
        ]
    for i, (names, env, message) in enumerate(_REMOVED):
        opts.append(
            o(
                *names,
                f"spec_removed_{i}",
                envvar=env,
                hidden=True,
                expose_value=False,
                callback=_removed(message),
            )
        )
    for i, (names, takes_value) in enumerate(_PLACEMENT):
        if takes_value:
            opts.append(o(*names, f"spec_ignored_{i}", hidden=True, expose_value=False))
        else:
            opts.append(o(*names, f"spec_ignored_{i}", is_flag=True, hidden=True, expose_value=False))
    for opt in reversed(opts):
        f = opt(f)
    return f


def _float(text: str, flag: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise click.BadParameter("invalid value", param_hint=flag) from None


def _cache_type(name: str, flag: str) -> str:
    if name not in KV_TYPES:
        raise click.BadParameter(
            f"KV cache type {name!r} is not supported: use {' or '.join(KV_TYPES)}", param_hint=flag
        )
    return name


def _types(kw: dict[str, Any]) -> tuple[SpecType, ...]:
    types: list[SpecType] = [SpecType.NONE]  # llama.cpp appends to its default list
    for value in kw["spec_type"]:
        try:
            types += parse_spec_types(value.split(","))
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--spec-type") from None
    if kw["spec_default"]:
        types.append(SpecType.NGRAM_MOD)
    real = tuple(t for t in types if t != SpecType.NONE)
    return real if real else (SpecType.NONE,)


def build_spec_config(kw: dict[str, Any]) -> SpeculativeConfig:
    """The speculative settings from parsed options; click.UsageError on invalid combinations."""
    if kw["spec_draft_hf"]:
        raise click.UsageError("--spec-draft-hf: downloading a draft model is not supported; use -md FILE")
    sampling = kw["spec_draft_sampling"]
    if sampling not in ("greedy", "probabilistic"):
        raise click.BadParameter(
            "invalid value, must be one of: greedy, probabilistic", param_hint="--spec-draft-sampling"
        )
    draft_model = kw["spec_draft_model"] or ""
    if draft_model and not Path(draft_model).is_file():
        raise click.UsageError(f"draft model file not found: {draft_model}")
    synth_len = -1.0
    if kw["spec_synth_len"] is not None:
        synth_len = _float(kw["spec_synth_len"], "--spec-synth-len")
        if synth_len == -1.0 or math.isnan(synth_len):
            raise click.BadParameter("invalid value", param_hint="--spec-synth-len")
    rates: tuple[float, ...] = ()
    if kw["spec_synth_rates"]:
        rates = tuple(_float(r, "--spec-synth-rates") for r in kw["spec_synth_rates"].split(","))
    mod = NgramModParams(kw["spec_ngram_mod_n_match"], kw["spec_ngram_mod_n_min"], kw["spec_ngram_mod_n_max"])
    if kw["spec_default"]:
        mod = NgramModParams(24, 48, 64)
    maps = {
        kind: NgramMapParams(
            *(kw[f"spec_ngram_{kind.replace('-', '_')}_{p}"] for p in ("size_n", "size_m", "min_hits"))
        )
        for kind in _NGRAM_MAPS
    }
    cfg = SpeculativeConfig(
        types=_types(kw),
        draft=DraftParams(
            model=draft_model,
            n_max=kw["spec_draft_n_max"],
            n_min=kw["spec_draft_n_min"],
            p_min=kw["spec_draft_p_min"],
            p_split=kw["spec_draft_p_split"],
            probabilistic=sampling == "probabilistic",
            cache_type_k=_cache_type(kw["spec_draft_type_k"], "--spec-draft-type-k"),
            cache_type_v=_cache_type(kw["spec_draft_type_v"], "--spec-draft-type-v"),
            flash_attn=kw.get("flash_attn") or "auto",  # -fa applies to the draft's context too
        ),
        ngram_simple=maps["simple"],
        ngram_map_k=maps["map-k"],
        ngram_map_k4v=maps["map-k4v"],
        ngram_mod=mod,
        lookup_cache_static=kw["spec_lookup_cache_static"] or "",
        lookup_cache_dynamic=kw["spec_lookup_cache_dynamic"] or "",
        synth_len=synth_len,
        synth_rates=rates,
        adaptive=kw["spec_adaptive"],
    )
    if cfg.lookup_cache_static and not Path(cfg.lookup_cache_static).is_file():
        raise click.UsageError(f"static lookup cache not found: {cfg.lookup_cache_static}")
    try:
        return cfg.validate()
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def spec_counters(engine: Any) -> dict[str, int]:
    """The `spec_decode_*` counters of /metrics (zero without speculative decoding)."""
    spec = engine.speculator
    stats = spec.stats if spec is not None else None
    return {
        "spec_decode_num_draft_tokens_total": stats.n_draft_tokens if stats else 0,
        "spec_decode_num_accepted_tokens_total": stats.n_accepted if stats else 0,
        "spec_decode_num_drafts_total": stats.n_drafts if stats else 0,
    }


def spec_per_position(engine: Any) -> list[str]:
    """The labeled per-position counter, once speculative verification has run."""
    spec = engine.speculator
    if spec is None or spec.stats.n_drafts == 0:
        return []
    name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
    lines = [f"# HELP {name} Accepted tokens per draft position", f"# TYPE {name} counter"]
    lines += [f'{name}{{position="{i}"}} {n}' for i, n in enumerate(spec.stats.accepted_per_pos)]
    return lines
