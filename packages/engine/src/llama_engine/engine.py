"""The engine: one thread that owns the model, the KV cache and the scheduler.

Callers (HTTP workers, the `LLM` API) only enqueue typed requests and read typed events from a
`RequestHandle`; they never touch the model. Each loop iteration admits waiting requests, builds one
batch, runs one forward pass and hands each output row to its slot.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numba
import numpy as np

from gguf_io import GGUFFile
from gguf_io import open as open_gguf

from .arch import DecoderModel, load_model
from .batch import Batch
from .kv_cache import KVCacheFullError
from .requests import EmbeddingRequest, FinalEvent, GenerationRequest, Pooling, TokenEvent
from .scheduler import Scheduler
from .tokenizer import Tokenizer

__all__ = ["Engine", "EngineConfig", "QueueFullError", "RequestHandle"]


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound: try again later (the server answers 503 with Retry-After)."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Decisions made once at the edge and applied to the model (gpt-fast style)."""

    n_ctx: int = 4096  # KV cells shared by all slots (0: the model's training context)
    n_parallel: int = 1  # slots: concurrent sequences
    n_batch: int = 512  # tokens per forward pass (prompt chunks and decode tokens together)
    n_threads: int | None = None  # numba threads; None: all cores
    max_queue: int = 64  # waiting requests beyond the busy slots
    kv_unified: bool = True  # every slot may use the whole context (else n_ctx / n_parallel each)
    swa_full: bool = False
    warmup: bool = True


class RequestHandle:
    """Events of one request, in order: TokenEvents, then one FinalEvent. Iterable; cancellable."""

    def __init__(self, on_event: Callable[[TokenEvent | FinalEvent], None] | None = None) -> None:
        self._events: queue.SimpleQueue[TokenEvent | FinalEvent] = queue.SimpleQueue()
        self._on_event = on_event
        self.cancel_flag = [False]
        self.final: FinalEvent | None = None

    def _emit(self, ev: TokenEvent | FinalEvent) -> None:
        if isinstance(ev, FinalEvent):
            self.final = ev
        if self._on_event is not None:
            self._on_event(ev)
        else:
            self._events.put(ev)

    def cancel(self) -> None:
        """Stop the generation at the next step; the slot is freed and its cache kept for reuse."""
        self.cancel_flag[0] = True

    def __iter__(self) -> Iterator[TokenEvent | FinalEvent]:
        while True:
            ev = self._events.get()
            yield ev
            if isinstance(ev, FinalEvent):
                return


class Engine:
    """Load a model and serve generation and embedding requests from one loop thread."""

    def __init__(
        self, model: str | os.PathLike[str] | GGUFFile, config: EngineConfig = EngineConfig()
    ) -> None:
        if config.n_threads:
            numba.set_num_threads(min(config.n_threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
        self.gguf = model if isinstance(model, GGUFFile) else open_gguf(model)
        self.model: DecoderModel = load_model(self.gguf)
        self.tokenizer = Tokenizer.from_gguf(
            self.gguf.tokenizer, self.gguf.header.name, self.gguf.header.architecture
        )
        c = self.model.config
        n_ctx = config.n_ctx or c.n_ctx_train
        if config.n_parallel < 1:
            raise ValueError("n_parallel must be at least 1")
        self.config = config
        self.n_ctx = n_ctx
        # One more sequence than slots: the last one is scratch space for embedding requests.
        self.kv = self.model.make_kv_cache(n_ctx, config.n_parallel + 1, config.n_batch, config.swa_full)
        n_ctx_slot = n_ctx if config.kv_unified else n_ctx // config.n_parallel
        self.n_ctx_slot = min(n_ctx_slot, c.n_ctx_train)
        self.scheduler = Scheduler(
            self.kv,
            self.tokenizer,
            c.n_vocab,
            config.n_parallel,
            self.n_ctx_slot,
            config.n_batch,
            self.model.shift_k,
        )
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._running = False
        self.ready = threading.Event()
        self.steps = 0

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> Engine:
        if self._thread is None:
            self._running = True
            self._thread = threading.Thread(target=self._loop, name="llama-engine", daemon=True)
            self._thread.start()
        return self

    def shutdown(self) -> None:
        self._running = False
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def warmup(self) -> None:
        """Compile every kernel on the real shapes (one prompt chunk and one decode step), then forget."""
        seq = self.config.n_parallel
        bos = self.tokenizer.bos_id if self.tokenizer.bos_id is not None else 0
        self.model.forward(Batch.single([bos] * 12, seq), self.kv)
        self.model.forward(Batch.single([bos], seq, 12), self.kv)
        self.kv.seq_rm(seq)

    # -- requests ----------------------------------------------------------------------------------------

    def submit(
        self, req: GenerationRequest, on_event: Callable[[TokenEvent | FinalEvent], None] | None = None
    ) -> RequestHandle:
        """Queue a generation. Raises QueueFullError when too many requests wait, ValueError when the
        prompt cannot fit the slot's context."""
        self._validate(req.prompt)
        if len(self.scheduler.waiting) >= self.config.max_queue:
            raise QueueFullError(f"{len(self.scheduler.waiting)} requests are already waiting")
        handle = RequestHandle(on_event)
        self._inbox.put(("gen", req, handle))
        return handle

    def embed(self, req: EmbeddingRequest) -> np.ndarray:
        """Pooled, normalized embedding (or per-token embeddings for Pooling.NONE); blocks until done."""
        self._validate(req.prompt)
        done: queue.SimpleQueue = queue.SimpleQueue()
        self._inbox.put(("embd", req, done))
        result = done.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def _validate(self, prompt: list[int]) -> None:
        if not prompt:
            raise ValueError("the prompt is empty")
        if len(prompt) > self.n_ctx_slot:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens, more than the context of a slot ({self.n_ctx_slot})"
            )
        n_vocab = self.model.config.n_vocab
        arr = np.asarray(prompt)
        if arr.min() < 0 or arr.max() >= n_vocab:
            raise ValueError(f"prompt token ids must lie in 0..{n_vocab - 1}")

    # -- the loop ----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        if self.config.warmup:
            self.warmup()
        self.ready.set()
        sched = self.scheduler
        while self._running:
            if not self._drain(block=not sched.busy):
                break
            sched.admit()
            self.step()

    def _drain(self, block: bool) -> bool:
        """Take everything in the inbox; returns False on shutdown."""
        try:
            item = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if item is None:
                return False
            kind, req, target = item
            if kind == "gen":
                self.scheduler.waiting.append((req, target._emit, target.cancel_flag))
            else:
                self._run_embedding(req, target)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def step(self) -> None:
        """One forward pass over the scheduled batch, then sampling for its output rows."""
        sched = self.scheduler
        planned = sched.schedule()
        if planned is None:
            return
        batch, owners = planned
        try:
            logits, _ = self.model.forward(batch, self.kv)
        except KVCacheFullError as e:
            self._undo(batch)
            self._evict_or_fail(owners, str(e))
            return
        except Exception as e:
            self._undo(batch)
            sched.fail_all(f"internal error: {type(e).__name__}: {e}")
            return
        sched.committed(batch)
        sched.postprocess(logits, owners)
        self.steps += 1

    def _undo(self, batch: Batch) -> None:
        for seq in np.unique(batch.seq):
            self.kv.seq_rm(int(seq), int(batch.pos[batch.seq == seq].min()))

    def _evict_or_fail(self, owners: list, message: str) -> None:
        """Out of cells: drop idle slots' cached tokens; if none, fail the newest running request."""
        sched = self.scheduler
        idle = [s for s in sched.slots if s.state == 0 and s.tokens]
        if idle:
            for s in idle:
                self.kv.seq_rm(s.id)
                s.tokens = []
            return
        running = [s for s in sched.slots if s.state != 0]
        if running:
            sched.fail(max(running, key=lambda s: s.t_start), f"the KV cache is full: {message}")

    def _run_embedding(self, req: EmbeddingRequest, done: queue.SimpleQueue) -> None:
        seq = self.config.n_parallel
        try:
            hidden = []
            for start in range(0, len(req.prompt), self.config.n_batch):
                chunk = req.prompt[start : start + self.config.n_batch]
                _, h = self.model.forward(Batch.single(chunk, seq, start, all_logits=True), self.kv)
                hidden.append(h)
            done.put(_pool(np.concatenate(hidden), req.pooling, req.normalize))
        except Exception as e:
            done.put(e)
        finally:
            self.kv.seq_rm(seq)


def _pool(h: np.ndarray, pooling: Pooling, normalize: int) -> np.ndarray:
    """llama.cpp's pooling and common_embd_normalize."""
    if pooling == Pooling.NONE:
        return np.stack([_normalize(r, normalize) for r in h])
    v = {Pooling.MEAN: h.mean(axis=0), Pooling.CLS: h[0], Pooling.LAST: h[-1]}[pooling]
    return _normalize(v.astype(np.float32), normalize)


def _normalize(v: np.ndarray, norm: int) -> np.ndarray:
    if norm < 0:
        return v
    if norm == 0:
        s = np.abs(v).max() / 32760.0
    elif norm == 2:
        s = np.sqrt(np.sum(v.astype(np.float64) ** 2))
    else:
        s = np.sum(np.abs(v.astype(np.float64)) ** norm) ** (1.0 / norm)
    return (v / s).astype(np.float32) if s > 0 else v
