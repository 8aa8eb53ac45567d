"""llama-server's options as the router knows them, without importing the server: every spelling (short,
long, negative, env name), whether it takes a value, and how an entry's options render to child arguments.

The table mirrors `llama-server --help` (a test compares it with the server's own command) plus the
llama.cpp options a preset may name that this server does not take (`mmproj`, ...): those
are kept in an entry and shown in its preset, but not passed to the child.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec_options import SPEC_ROWS

__all__ = [
    "OPTIONS",
    "PRESET_ONLY",
    "Option",
    "UnknownOption",
    "canonical",
    "lookup",
    "parse_bool",
    "render",
]

_TRUE, _FALSE = ("true", "1", "on", "enabled"), ("false", "0", "off", "disabled")


@dataclass(frozen=True, slots=True)
class Option:
    """One option: `key` is its first long name without dashes (the name an entry stores it under)."""

    names: tuple[str, ...]
    negative: tuple[str, ...] = ()
    env: str | None = None
    value: bool = True
    child: bool = True  # the server takes it

    @property
    def key(self) -> str:
        return next(n for n in self.names if n.startswith("--"))[2:]

    @property
    def long(self) -> str:
        return "--" + self.key


def _o(names: str, env: str | None = None, value: bool = True, neg: str = "", child: bool = True) -> Option:
    return Option(tuple(names.split()), tuple(neg.split()), env, value, child)


_F = False  # a flag (takes no value)
_NO_PROXY = "--no-ui-mcp-proxy --no-webui-mcp-proxy"
OPTIONS: tuple[Option, ...] = (
    _o("-m --model", "LLAMA_ARG_MODEL"),
    _o("-a --alias", "LLAMA_ARG_ALIAS"),
    _o("--tags", "LLAMA_ARG_TAGS"),
    _o("-c --ctx-size", "LLAMA_ARG_CTX_SIZE"),
    _o("-np --parallel", "LLAMA_ARG_N_PARALLEL"),
    _o("-kvu --kv-unified", None, _F, "-no-kvu --no-kv-unified"),
    _o("-b --batch-size", "LLAMA_ARG_BATCH"),
    _o("-ub --ubatch-size", "LLAMA_ARG_UBATCH"),
    _o("-t --threads", "LLAMA_ARG_THREADS"),
    _o("-n --n-predict --predict", "LLAMA_ARG_N_PREDICT"),
    _o("--keep"),
    _o("--context-shift", "LLAMA_ARG_CONTEXT_SHIFT", _F, "--no-context-shift"),
    _o("--cache-prompt", "LLAMA_ARG_CACHE_PROMPT", _F, "--no-cache-prompt"),
    _o("--warmup", None, _F, "--no-warmup"),
    _o("--swa-full", "LLAMA_ARG_SWA_FULL", _F),
    _o("-ctxcp --ctx-checkpoints --swa-checkpoints", "LLAMA_ARG_CTX_CHECKPOINTS"),
    _o("-cms --checkpoint-min-step", "LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT"),
    _o("-ctk --cache-type-k", "LLAMA_ARG_CACHE_TYPE_K"),
    _o("-ctv --cache-type-v", "LLAMA_ARG_CACHE_TYPE_V"),
    _o("--slot-save-path"),
    _o("--scheduling-policy", "LLAMA_ARG_SCHEDULING_POLICY"),
    _o("--exact-floats", "LLAMA_EXACT_FLOATS", _F),
    _o("--host", "LLAMA_ARG_HOST"),
    _o("--port", "LLAMA_ARG_PORT"),
    _o("--api-prefix", "LLAMA_ARG_API_PREFIX"),
    _o("--api-key", "LLAMA_API_KEY"),
    _o("--api-key-file", "LLAMA_ARG_API_KEY_FILE"),
    _o("--ssl-key-file", "LLAMA_ARG_SSL_KEY_FILE"),
    _o("--ssl-cert-file", "LLAMA_ARG_SSL_CERT_FILE"),
    _o("-to --timeout", "LLAMA_ARG_TIMEOUT"),
    _o("--sse-ping-interval", "LLAMA_ARG_SSE_PING_INTERVAL"),
    _o("--cors-origins", "LLAMA_ARG_CORS_ORIGINS"),
    _o("--cors-methods", "LLAMA_ARG_CORS_METHODS"),
    _o("--cors-headers", "LLAMA_ARG_CORS_HEADERS"),
    _o("--cors-credentials", "LLAMA_ARG_CORS_CREDENTIALS", _F, "--no-cors-credentials"),
    _o("--metrics", "LLAMA_ARG_ENDPOINT_METRICS", _F),
    _o("--props", "LLAMA_ARG_ENDPOINT_PROPS", _F),
    _o("--slots", "LLAMA_ARG_ENDPOINT_SLOTS", _F, "--no-slots"),
    _o("--ui --webui", "LLAMA_ARG_UI", _F, "--no-ui --no-webui"),
    _o("--path", "LLAMA_ARG_STATIC_PATH"),
    _o("--max-queue"),
    _o("--jinja", "LLAMA_ARG_JINJA", _F, "--no-jinja"),
    _o("--chat-template", "LLAMA_ARG_CHAT_TEMPLATE"),
    _o("--chat-template-file", "LLAMA_ARG_CHAT_TEMPLATE_FILE"),
    _o("--chat-template-kwargs", "LLAMA_ARG_CHAT_TEMPLATE_KWARGS"),
    _o("--reasoning-format", "LLAMA_ARG_THINK"),
    _o("--prefill-assistant", "LLAMA_ARG_PREFILL_ASSISTANT", _F, "--no-prefill-assistant"),
    _o("-r --reverse-prompt"),
    _o("--embedding --embeddings", "LLAMA_ARG_EMBEDDINGS", _F),
    _o("--pooling", "LLAMA_ARG_POOLING"),
    _o("--embd-normalize"),
    _o("-s --seed"),
    _o("--temp --temperature", "LLAMA_ARG_TEMPERATURE"),
    _o("--top-k", "LLAMA_ARG_TOP_K"),
    _o("--top-p", "LLAMA_ARG_TOP_P"),
    _o("--min-p", "LLAMA_ARG_MIN_P"),
    _o("--top-nsigma --top-n-sigma"),
    _o("--xtc-probability"),
    _o("--xtc-threshold"),
    _o("--typical --typical-p"),
    _o("--repeat-last-n"),
    _o("--repeat-penalty", "LLAMA_ARG_REPEAT_PENALTY"),
    _o("--presence-penalty", "LLAMA_ARG_PRESENCE_PENALTY"),
    _o("--frequency-penalty", "LLAMA_ARG_FREQUENCY_PENALTY"),
    _o("--dry-multiplier"),
    _o("--dry-base"),
    _o("--dry-allowed-length"),
    _o("--dry-penalty-last-n"),
    _o("--dry-sequence-breaker"),
    _o("--dynatemp-range"),
    _o("--dynatemp-exp"),
    _o("--mirostat"),
    _o("--mirostat-lr"),
    _o("--mirostat-ent"),
    _o("--samplers"),
    _o("--sampler-seq --sampling-seq"),
    _o("--ignore-eos", None, _F),
    _o("-l --logit-bias"),
    _o("--grammar"),
    _o("--grammar-file"),
    _o("-j --json-schema"),
    _o("-jf --json-schema-file"),
    _o("--log-disable", None, _F),
    _o("--log-file", "LLAMA_ARG_LOG_FILE"),
    _o("--log-jsonl", "LLAMA_ARG_LOG_JSONL", _F, "--no-log-jsonl"),
    _o("-v --verbose --log-verbose", None, _F),
    _o("-lv --verbosity --log-verbosity", "LLAMA_ARG_LOG_VERBOSITY"),
    _o("-fa --flash-attn", "LLAMA_ARG_FLASH_ATTN"),
    # accepted by the server with no effect (no GPU backends)
    _o("-ngl --gpu-layers --n-gpu-layers", "LLAMA_ARG_N_GPU_LAYERS"),
    _o("--mlock", "LLAMA_ARG_MLOCK", _F),
    _o("--media-path"),
    _o("--mmap", "LLAMA_ARG_MMAP", _F, "--no-mmap"),
    _o("--numa", "LLAMA_ARG_NUMA"),
    _o("-dev --device", "LLAMA_ARG_DEVICE"),
    _o("-sm --split-mode", "LLAMA_ARG_SPLIT_MODE"),
    _o("-ts --tensor-split", "LLAMA_ARG_TENSOR_SPLIT"),
    _o("-mg --main-gpu", "LLAMA_ARG_MAIN_GPU"),
    _o("-kvo --kv-offload", "LLAMA_ARG_KV_OFFLOAD", _F, "-nkvo --no-kv-offload"),
    _o("-fit --fit", "LLAMA_ARG_FIT"),
    _o("-cb --cont-batching", "LLAMA_ARG_CONT_BATCHING", _F, "-nocb --no-cont-batching"),
    _o("-tb --threads-batch", "LLAMA_ARG_THREADS_BATCH"),
    _o("--threads-http", "LLAMA_ARG_THREADS_HTTP"),
    _o("--cache-reuse", "LLAMA_ARG_CACHE_REUSE"),
    _o("-sps --slot-prompt-similarity"),
    _o("-cram --cache-ram", "LLAMA_ARG_CACHE_RAM"),
    _o("--reasoning-budget", "LLAMA_ARG_THINK_BUDGET"),
    _o("--rope-scaling", "LLAMA_ARG_ROPE_SCALING_TYPE"),
    _o("--rope-scale", "LLAMA_ARG_ROPE_SCALE"),
    _o("--rope-freq-scale", "LLAMA_ARG_ROPE_FREQ_SCALE"),
    _o("--yarn-orig-ctx", "LLAMA_ARG_YARN_ORIG_CTX"),
    _o("--yarn-ext-factor", "LLAMA_ARG_YARN_EXT_FACTOR"),
    _o("--yarn-attn-factor", "LLAMA_ARG_YARN_ATTN_FACTOR"),
    _o("--yarn-beta-slow", "LLAMA_ARG_YARN_BETA_SLOW"),
    _o("--yarn-beta-fast", "LLAMA_ARG_YARN_BETA_FAST"),
    _o("--reasoning-budget-message", "LLAMA_ARG_THINK_BUDGET_MESSAGE"),
    _o("-sp --special", None, _F),
    _o("-rea --reasoning", "LLAMA_ARG_REASONING"),
    _o("--log-colors", "LLAMA_LOG_COLORS"),
    _o("--log-prefix", "LLAMA_LOG_PREFIX", _F, "--no-log-prefix"),
    _o("--log-timestamps", "LLAMA_LOG_TIMESTAMPS", _F, "--no-log-timestamps"),
    _o("--no-host", None, _F),
    _o("--repack", None, _F, "-nr --no-repack"),
    _o("--check-tensors", None, _F),
    _o("-dt --defrag-thold", "LLAMA_ARG_DEFRAG_THOLD"),
    _o("--list-devices", None, _F),
    # downloads (the server resolves them through llama_tools.hub)
    _o("-hf -hfr --hf-repo", "LLAMA_ARG_HF_REPO"),
    _o("-hff --hf-file", "LLAMA_ARG_HF_FILE"),
    _o("-hft --hf-token", "HF_TOKEN"),
    _o("--offline", "LLAMA_ARG_OFFLINE", _F),
    _o("-mu --model-url", "LLAMA_ARG_MODEL_URL"),
    _o("--sleep-idle-seconds", "LLAMA_ARG_SLEEP_IDLE_SECONDS"),
    # llama.cpp options this server does not take: kept in the entry, never passed to a child
    _o("-mm --mmproj", "LLAMA_ARG_MMPROJ", child=False),
    _o("--mmproj-auto", "LLAMA_ARG_MMPROJ_AUTO", _F, "--no-mmproj --no-mmproj-auto", child=False),
    _o("-hfd -hfrd --hf-repo-draft --spec-draft-hf", "LLAMA_ARG_HFD_REPO", child=False),
    _o("-dr --docker-repo", "LLAMA_ARG_DOCKER_REPO", child=False),
    _o("--lora", child=False),
    _o("--rerank --reranking", "LLAMA_ARG_RERANKING", _F, child=False),
    _o("--media-path", child=False),
    # the router's own (never passed to a child)
    _o("--tools", "LLAMA_ARG_TOOLS", child=False),
    _o("--tools-dir", "LLAMA_ARG_TOOLS_DIR", child=False),
    _o("--tools-runtime", "LLAMA_ARG_TOOLS_RUNTIME", child=False),
    _o("-ag --agent", "LLAMA_ARG_AGENT", _F, "-no-ag --no-agent", child=False),
    _o("--mcp-servers-config", "LLAMA_ARG_MCP_SERVERS_CONFIG", child=False),
    _o("--mcp-servers-json", "LLAMA_ARG_MCP_SERVERS_JSON", child=False),
    _o("--ui-mcp-proxy --webui-mcp-proxy", "LLAMA_ARG_UI_MCP_PROXY", _F, _NO_PROXY, child=False),
    _o("--cors-proxy-allow", "LLAMA_ARG_CORS_PROXY_ALLOW", child=False),
    _o("--models-dir", "LLAMA_ARG_MODELS_DIR", child=False),
    _o("--models-preset", "LLAMA_ARG_MODELS_PRESET", child=False),
    _o("--models-max", "LLAMA_ARG_MODELS_MAX", child=False),
    _o("--keep-alive", "LLAMA_ARG_KEEP_ALIVE", child=False),
    _o("--keep-alive-max", "LLAMA_ARG_KEEP_ALIVE_MAX", child=False),
    # a store behind the router would see one caller (the router's key), not its clients: never passed
    _o("--store", "LLAMA_ARG_STORE", child=False),
    _o("--store-quota", "LLAMA_ARG_STORE_QUOTA", child=False),
    _o("--models-autoload", "LLAMA_ARG_MODELS_AUTOLOAD", _F, "--no-models-autoload", child=False),
    *(_o(names, env, value, neg) for names, env, value, neg in SPEC_ROWS),
)

# keys a preset may set that configure the router's handling of the entry
PRESET_ONLY = frozenset(
    {
        "load-on-startup",
        "stop-timeout",
        "pin",
        "keep-alive",
        "dedup-cache-models",
        "remote",
        "remote-api-key",
        "remote-api-key-file",
        # replicas on a Ray cluster (llama_router.cluster)
        "replicas",
        "min-replicas",
        "max-replicas",
        "num-cpus",
        "memory",
        "num-gpus",
        "target-ongoing-requests",
        "upscale-delay",
    }
)

_BY_NAME: dict[str, Option] = {}
_NEGATIVE: set[str] = set()
for _opt in OPTIONS:
    for _n in _opt.names:
        _BY_NAME[_n.lstrip("-")] = _opt
    for _n in _opt.negative:
        _BY_NAME[_n.lstrip("-")] = _opt
        _NEGATIVE.add(_n.lstrip("-"))
    if _opt.env:
        _BY_NAME[_opt.env] = _opt


class UnknownOption(KeyError):
    """A key that names no option."""


def lookup(key: str) -> tuple[Option, bool]:
    """The option a preset key or flag names (dashes optional), and whether it is a negative spelling."""
    k = key.lstrip("-") if key.startswith("-") else key
    opt = _BY_NAME.get(k)
    if opt is None:
        raise UnknownOption(key)
    return opt, k in _NEGATIVE


def parse_bool(value: str) -> bool | None:
    v = value.strip().lower()
    return True if v in _TRUE else False if v in _FALSE else None


def canonical(key: str, value: str) -> tuple[str, str]:
    """(entry key, entry value) for a preset `key = value`: negative spellings invert a boolean value."""
    opt, negative = lookup(key)
    if opt.value:
        return opt.key, value
    b = parse_bool(value)
    if b is None:
        raise ValueError(f"option '{key}' expects a boolean, got '{value}'")
    return opt.key, "true" if b != negative else "false"


def render(options: dict[str, str]) -> list[str]:
    """Child arguments for an entry's options (long names; a false flag takes its negative form, or is
    omitted when it has none). Options the server does not take are left out."""
    args: list[str] = []
    for key, value in options.items():
        opt, _ = lookup(key)
        if not opt.child:
            continue
        if opt.value:
            args += [opt.long, value]
        elif parse_bool(value):
            args.append(opt.long)
        elif opt.negative:
            args.append(next((n for n in opt.negative if n.startswith("--")), opt.negative[0]))
    return args
