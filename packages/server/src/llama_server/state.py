"""What the app shares between requests: settings, the engine once loaded, counters for /metrics."""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from llama_engine import Engine, EngineConfig, FinalEvent
from llama_engine.warmup import warm_sampling
from llama_quant.filetypes import F as LlamaFileType

from .builtin_templates import make_template
from .config import ServerConfig
from .control import LiveCompletions
from .latency import LatencyHistograms
from .model_overrides import open_with_overrides
from .prompts import max_piece_chars
from .resumable import SessionStore
from .store import Store
from .template import ChatTemplate

__all__ = [
    "DRAIN_MESSAGE",
    "TEXT_WORKERS",
    "Metrics",
    "ServerState",
    "SlotRecord",
    "release_heap",
    "settle_heap",
]

log = logging.getLogger("llama_server")

BUILD_INFO = "b0-llamapy"
DRAIN_MESSAGE = "the server is shutting down"
# Threads that tokenize and render templates. The tokenizer is pure Python and holds the GIL, so more threads
# would not tokenize faster; two let one long request run without queueing every other behind it.
TEXT_WORKERS = 2
T = TypeVar("T")


@dataclass(slots=True)
class Metrics:
    """Counters behind /metrics (llama.cpp's server_metrics)."""

    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_tokens_max: int = 0
    # since the previous scrape (the two throughput gauges)
    window_prompt_tokens: int = 0
    window_prompt_seconds: float = 0.0
    window_predicted_tokens: int = 0
    window_predicted_seconds: float = 0.0

    def prompt_batch(self, n_tokens: int, n_cached: int = 0) -> None:
        """Prompt tokens one batch evaluated (and, on a request's first update, those it reused), counted
        as llama.cpp counts them: when evaluated, not when the request ends."""
        self.prompt_tokens_total += n_tokens
        self.window_prompt_tokens += n_tokens
        self.prompt_tokens_cached_total += n_cached

    def record(self, ev: FinalEvent, prompt_counted: bool = False) -> None:
        t = ev.timings
        if not prompt_counted:  # else prompt_batch already counted its tokens
            self.prompt_batch(t.prompt_n, t.cache_n)
        self.prompt_seconds_total += t.prompt_ms / 1e3
        self.tokens_predicted_total += t.predicted_n
        self.tokens_predicted_seconds_total += t.predicted_ms / 1e3
        self.n_tokens_max = max(self.n_tokens_max, t.cache_n + t.prompt_n + t.predicted_n)
        self.window_prompt_seconds += t.prompt_ms / 1e3
        self.window_predicted_tokens += max(t.predicted_n - 1, 0)
        self.window_predicted_seconds += t.predicted_ms / 1e3


@dataclass(slots=True)
class SlotRecord:
    """What /slots shows about a slot's last task."""

    id_task: int = -1
    n_prompt_tokens: int = 0
    n_prompt_tokens_processed: int = 0
    n_prompt_tokens_cache: int = 0
    n_decoded: int = 0
    scope: str = ""  # the task's cache scope: /slots shows the record only to that scope


@dataclass(slots=True)
class ServerState:
    """Shared by all handlers. `engine` is None until the model is loaded and warmed up."""

    config: ServerConfig
    engine: Engine | None = None
    template: ChatTemplate | None = None
    load_error: str | None = None
    metrics: Metrics = field(default_factory=Metrics)
    latency: LatencyHistograms | None = None  # with --metrics, once the model is loaded
    slots: dict[int, SlotRecord] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    next_task: int = 0
    ready: threading.Event = field(default_factory=threading.Event)
    exit_on_load_error: bool = False
    draining: bool = False
    # called on the event loop with a message when draining starts; each ends the open responses it owns
    drain_hooks: list[Callable[[str], object]] = field(default_factory=list)
    loop: asyncio.AbstractEventLoop | None = None  # the app's event loop, set when it starts serving
    streams: SessionStore = field(default_factory=SessionStore)  # resumable streams by X-Conversation-Id
    lora_scales: list[float] | None = None  # the global LoRA scales (llama_server.lora)
    live: LiveCompletions = field(default_factory=LiveCompletions)  # chat completions by id (control.py)
    store: Store | None = None  # --store: conversations and responses (llama_server.store)
    _loader: threading.Thread | None = None
    _pool: ThreadPoolExecutor | None = None

    def __post_init__(self) -> None:
        if self.config.store_path and self.store is None:  # ValueError: the database cannot be opened
            self.store = Store(self.config.store_path, self.config.store_quota_mib << 20)

    def require_store(self) -> Store:
        from .errors import ApiError

        if self.store is None:
            raise ApiError(
                "This server keeps no responses or conversations. Start it with `--store PATH`",
                "not_supported_error",
            )
        return self.store

    @property
    def model_name(self) -> str:
        return self.config.model_name

    def task_id(self) -> int:
        self.next_task += 1
        return self.next_task - 1

    def require_engine(self) -> Engine:
        from .errors import ApiError

        if self.engine is None:
            raise ApiError("Loading model", "unavailable_error")
        return self.engine

    async def offload(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in the text worker pool (tokenizing, template rendering), awaited: the event
        loop keeps serving meanwhile. Cancelling the await drops the call (not run yet) or its result."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(TEXT_WORKERS, thread_name_prefix="llama-server-text")
        return await asyncio.get_running_loop().run_in_executor(self._pool, partial(fn, *args, **kwargs))

    # -- shutting down ---------------------------------------------------------------------------------

    def begin_drain(self, message: str = DRAIN_MESSAGE) -> None:
        """Stop taking requests and end every open response with a final error event (`drain_hooks`).
        Safe to call from any thread and from a signal handler: the hooks run on the event loop."""
        self.draining = True
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._run_drain_hooks, message)

    def _run_drain_hooks(self, message: str) -> None:
        for hook in self.drain_hooks:
            try:
                hook(message)
            except Exception:  # one hook failing must not keep the other responses open
                log.exception("ending the open responses on shutdown failed")

    # -- loading ---------------------------------------------------------------------------------------

    def start_loading(self) -> None:
        """Build the engine in a background thread: /health answers 503 until it is ready."""
        if self.engine is not None or self.ready.is_set():  # built by the caller
            if self.engine is not None and self.template is None:
                self.template = self._make_template(self.engine)
            if self.engine is not None:
                self._histograms(self.engine)
            self.ready.set()
            return
        if self._loader is None:
            self._loader = threading.Thread(target=self._load, name="llama-server-load", daemon=True)
            self._loader.start()

    def _load(self) -> None:
        cfg = self.config
        gc.disable()  # loading makes long-lived objects only: full collections would walk them for nothing
        try:
            t0 = time.perf_counter()
            engine = Engine(
                open_with_overrides(cfg.model, cfg.override_kv, cfg.rope_freq_base),
                EngineConfig(
                    n_ctx=cfg.n_ctx,
                    n_parallel=cfg.n_parallel,
                    n_batch=min(cfg.n_batch, cfg.n_ubatch) if cfg.embeddings else cfg.n_batch,
                    n_threads=cfg.n_threads,
                    max_queue=cfg.max_queue,
                    kv_unified=cfg.kv_unified,
                    warmup=cfg.warmup,
                    swa_full=cfg.swa_full,
                    cache_type_k=cfg.cache_type_k,
                    cache_type_v=cfg.cache_type_v,
                    flash_attn=cfg.flash_attn,
                    speculative=cfg.speculative,
                    lora=tuple(p for p, _ in cfg.lora),
                    checkpoints=cfg.checkpoints,
                    cache_ram_mib=cfg.cache_ram[0],
                    cache_idle_slots=cfg.cache_ram[1],
                    scheduling_policy=cfg.scheduling_policy,
                    exact_floats=cfg.exact_floats or None,  # else LLAMA_EXACT_FLOATS, else fast
                ),
            ).start()
            engine.tokenizer.warmup()
            max_piece_chars(engine.tokenizer)
            self.template = self._make_template(engine)
            engine.wait_ready()
            if cfg.warmup:  # the first request's chain: the server's defaults, when not llama.cpp's
                warm_sampling(engine.model.config.n_vocab, (cfg.sampling,))
            self._histograms(engine)
            self.engine = engine
            self.ready.set()
            log.info("model loaded in %.1f s", time.perf_counter() - t0)
            model = engine.model
            floats = "exact (f64 sums)" if model.exact_floats else "fast (f32 sums)"
            log.info("kernels: %s; F16/BF16/F32 weights %s", model.kernels.name.lower(), floats)
            settle_heap()
            print(
                f"main: server is listening on http://{cfg.host}:{cfg.port} - starting the main loop",
                flush=True,
            )
        except Exception as e:
            gc.enable()
            self.load_error = f"{type(e).__name__}: {e}"
            log.error("failed to load the model: %s", self.load_error)
            if self.exit_on_load_error:  # the command line: a server that cannot load its model is useless
                os._exit(1)

    def _histograms(self, engine: Engine) -> None:
        """With --metrics, the latency histograms (kept across a sleep's reload)."""
        if self.config.endpoint_metrics and self.latency is None:
            self.latency = LatencyHistograms(self.model_name, engine.n_ctx_slot)

    def _make_template(self, engine: Engine) -> ChatTemplate:
        tok = engine.tokenizer
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
        model_tmpl = engine.gguf.metadata.get("tokenizer.chat_template")
        model_src = model_tmpl if isinstance(model_tmpl, str) and model_tmpl else None
        return make_template(self.config.chat_template, model_src, self.config.jinja, bos, eos)

    def shutdown(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        self.ready.clear()

    # -- helpers used by several controllers ---------------------------------------------------------------

    def model_meta(self) -> dict[str, Any]:
        engine = self.require_engine()
        c = engine.model.config
        size = os.path.getsize(self.config.model) if os.path.exists(self.config.model) else 0
        n_params = sum(math.prod(t.shape) for t in engine.gguf.tensors.values())
        return {
            "vocab_type": int(engine.tokenizer.vocab.type),
            "n_vocab": c.n_vocab,
            "n_ctx": engine.n_ctx_slot,
            "n_ctx_train": c.n_ctx_train,
            "n_embd": engine.gguf.header.embedding_length,
            "n_params": n_params,
            "size": size,
            "ftype": _ftype_name(engine.gguf.header.file_type),
        }


def _ftype_name(ft: int | None) -> str:
    """llama-quantize's name of a file type (`general.file_type`)."""
    try:
        name = LlamaFileType(ft if ft is not None else -1).name
    except ValueError:
        return f"ftype {ft}"
    return "F32" if name == "ALL_F32" else name


def settle_heap() -> None:
    """Collect what loading left behind, freeze the rest (the model's tables, the tokenizer's vocabulary,
    the compiled kernels' objects) out of the garbage collector's view, and turn collection back on (`_load`
    turns it off: each full collection during a load walked every object made so far, ~0.1 s of a start).
    Without the freeze, a full collection walks those few hundred thousand long-lived objects while holding
    the GIL: a 60-120 ms pause of the event loop and every stream, set off at random by some request's
    allocations. `release_heap` undoes it before a model is let go."""
    gc.collect()
    gc.freeze()
    gc.enable()


def release_heap() -> None:
    """Let the collector see the frozen objects again (a model being released must be collectable)."""
    gc.unfreeze()
