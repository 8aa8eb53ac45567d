"""Continuous batching: which tokens of which slots go into the next forward pass.

A step is three calls (nano-vllm's shape): `schedule()` fills a batch from the active slots under a token
budget (one decode token per generating slot first, then prompt chunks), the model runs it, and
`postprocess()` samples, detokenizes, checks stop conditions and emits events. A new request takes the
idle slot whose cached tokens share the longest prefix with its prompt, and may also borrow a longer
cached prefix from any other slot (`seq_cp`: the cells are shared, not recomputed).
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .batch import Batch
from .kv_cache import KVCache
from .requests import FinalEvent, GenerationRequest, StopReason, Timings, TokenEvent, Usage
from .sampling import DryVocab, Sampler
from .tokenizer import Tokenizer

__all__ = ["Emit", "Scheduler", "Slot", "SlotState"]

Emit = Callable[[TokenEvent | FinalEvent], None]


class SlotState(enum.IntEnum):
    IDLE = 0
    PROMPT = 1
    GENERATE = 2


@dataclass(slots=True, eq=False)
class Slot:
    """One sequence of the KV cache and the request it is serving."""

    id: int
    tokens: list[int] = field(default_factory=list)  # what the KV cache holds for this sequence, in order
    state: SlotState = SlotState.IDLE
    request: GenerationRequest | None = None
    emit: Emit | None = None
    sampler: Sampler | None = None
    detok: object = None
    next_token: int = -1  # sampled, not yet in the cache
    n_prompt: int = 0
    n_cached: int = 0
    n_generated: int = 0
    held: str = ""  # text held back: it may be the start of a stop string
    cancel_flag: list[bool] = field(default_factory=lambda: [False])  # shared with the RequestHandle
    t_start: float = 0.0
    t_prompt_done: float = 0.0
    last_used: float = 0.0


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64)
    hit = np.flatnonzero(x)
    return int(hit[0]) if len(hit) else n


class Scheduler:
    """Slots, the waiting queue, and the per-step batch building and result handling."""

    def __init__(
        self,
        kv: KVCache,
        tokenizer: Tokenizer,
        n_vocab: int,
        n_parallel: int,
        n_ctx_slot: int,
        n_batch: int,
        shift_k: Callable[[int, np.ndarray, np.ndarray, int], None],
    ) -> None:
        self.kv = kv
        self.tokenizer = tokenizer
        self.n_vocab = n_vocab
        self.slots = [Slot(i) for i in range(n_parallel)]
        self.n_ctx_slot = n_ctx_slot
        self.n_batch = n_batch
        self.waiting: deque[tuple[GenerationRequest, Emit, list[bool]]] = deque()
        self._shift_k = shift_k
        self._dry_vocab: DryVocab | None = None
        self._eog = sorted(tokenizer.eog_ids)

    # -- admission ---------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self.waiting) or any(s.state != SlotState.IDLE for s in self.slots)

    def admit(self) -> None:
        """Move waiting requests into idle slots."""
        still: deque = deque()
        while self.waiting:
            req, emit, cancel_flag = self.waiting.popleft()
            if cancel_flag[0]:
                emit(self._final(None, req, StopReason.CANCELLED, emit_slot=-1))
                continue
            slot = self._pick_slot(req)
            if slot is None:
                still.append((req, emit, cancel_flag))
                continue
            self._start(slot, req, emit, cancel_flag)
        self.waiting = still

    def _pick_slot(self, req: GenerationRequest) -> Slot | None:
        if req.slot >= 0:
            s = self.slots[req.slot]
            return s if s.state == SlotState.IDLE else None
        idle = [s for s in self.slots if s.state == SlotState.IDLE]
        if not idle:
            return None
        return max(idle, key=lambda s: (_common_prefix(s.tokens, req.prompt), -s.last_used))

    def _start(self, slot: Slot, req: GenerationRequest, emit: Emit, cancel_flag: list[bool]) -> None:
        prompt = req.prompt
        slot.request, slot.emit = req, emit
        slot.t_start = time.perf_counter()
        slot.n_prompt = len(prompt)
        slot.n_generated, slot.held, slot.cancel_flag, slot.next_token = 0, "", cancel_flag, -1
        reused = self._reuse_prefix(slot, prompt) if req.cache_prompt else 0
        if not req.cache_prompt:
            self.kv.seq_rm(slot.id)
        slot.tokens = list(prompt[:reused])
        slot.n_cached = reused
        params = req.sampling
        vocab = self._dry() if params.dry_multiplier != 0 else None
        slot.sampler = Sampler(params, self.n_vocab, vocab=vocab, eog_tokens=self._eog, n_ctx=self.n_ctx_slot)
        slot.sampler.accept_many(prompt)
        slot.detok = self.tokenizer.streaming()
        slot.state = SlotState.PROMPT

    def _reuse_prefix(self, slot: Slot, prompt: list[int]) -> int:
        own = _common_prefix(slot.tokens, prompt)
        best, donor = own, None
        for other in self.slots:
            if other is not slot and other.tokens:
                n = _common_prefix(other.tokens, prompt)
                if n > best:
                    best, donor = n, other
        limit = len(prompt) - 1  # the last prompt token is always evaluated: its logits are needed
        if donor is not None:
            self.kv.seq_rm(slot.id)
            self.kv.seq_cp(donor.id, slot.id, 0, min(best, limit))
            slot.tokens = list(prompt[: min(best, limit)])
        n = min(best, limit)
        self.kv.seq_rm(slot.id, n)
        kept = self.kv.reusable_prefix(slot.id, n)
        if kept < n:
            self.kv.seq_rm(slot.id, kept)
        return kept

    def _dry(self) -> DryVocab:
        if self._dry_vocab is None:
            tok = self.tokenizer
            # llama.cpp: vocab.detokenize({t}, remove_special=false, unparse_special=true)
            pieces = [tok.detokenize([t], False, True) for t in range(tok.n_vocab)]
            self._dry_vocab = DryVocab(
                pieces,
                lambda b: tok.encode(b.decode("utf-8", "replace"), add_special=False, parse_special=False),
            )
        return self._dry_vocab

    # -- one step ----------------------------------------------------------------------------------------

    def schedule(self) -> tuple[Batch, list[Slot]] | None:
        """The next batch and, for each of its output rows, the slot it belongs to."""
        for s in self.slots:
            if s.state != SlotState.IDLE and s.cancel_flag[0]:
                self._finish(s, StopReason.CANCELLED)
        parts: list[Batch] = []
        owners: list[Slot] = []
        budget = self.n_batch
        for s in self.slots:
            if s.state == SlotState.GENERATE and budget > 0:
                if len(s.tokens) + 1 > self.n_ctx_slot and not self._make_room(s):
                    continue
                parts.append(Batch.single([s.next_token], s.id, len(s.tokens)))
                owners.append(s)
                budget -= 1
        for s in sorted(self.slots, key=lambda s: s.t_start):
            if s.state == SlotState.PROMPT and budget > 0:
                assert s.request is not None
                todo = s.request.prompt[len(s.tokens) :]
                chunk = todo[:budget]
                last = len(chunk) == len(todo)
                b = Batch.single(chunk, s.id, len(s.tokens))
                b.output[:] = False
                b.output[-1] = last
                parts.append(b)
                if last:
                    owners.append(s)
                budget -= len(chunk)
        if not parts:
            return None
        return Batch.concat(parts), owners

    def committed(self, batch: Batch) -> None:
        """The batch's tokens are now in the cache: record them per slot."""
        for s in self.slots:
            mine = batch.tokens[batch.seq == s.id]
            if len(mine):
                s.tokens.extend(int(t) for t in mine)
                s.last_used = time.perf_counter()

    def postprocess(self, logits: np.ndarray, owners: list[Slot]) -> None:
        """Sample one token per output row and advance its slot."""
        for row, s in enumerate(owners):
            if s.state == SlotState.PROMPT:
                s.state = SlotState.GENERATE
                s.t_prompt_done = time.perf_counter()
                assert s.request is not None
                if s.request.max_tokens == 0:  # llama.cpp's n_predict = 0: the prompt only, no token
                    self._finish(s, StopReason.LENGTH)
                    continue
            self._advance(s, logits[row])

    def _advance(self, s: Slot, row: np.ndarray) -> None:
        req, sampler = s.request, s.sampler
        assert req is not None and sampler is not None and s.emit is not None
        n_probs = req.sampling.n_probs
        if n_probs > 0:
            tp = sampler.sample_with_probs(row, n_probs, req.post_sampling_probs)
            token, prob, top = tp.token, tp.prob, tp.top
        else:
            token, prob, top = sampler.sample(row), 0.0, []
        sampler.accept(token)
        s.n_generated += 1
        if self.tokenizer.is_eog(token) and not req.sampling.ignore_eos:
            self._finish(s, StopReason.EOS)
            return
        text = s.held + s.detok.feed(token)  # type: ignore[attr-defined]
        emit_text, held, stop_word = _split_stop(text, req.stop)
        s.held = held
        timings = self._timings(s, time.perf_counter()) if req.timings_per_token else None
        s.emit(TokenEvent(token, emit_text, prob, top, timings))
        if stop_word:
            self._finish(s, StopReason.STOP_WORD, stop_word)
        elif 0 <= req.max_tokens <= s.n_generated:
            self._finish(s, StopReason.LENGTH)
        else:
            s.next_token = token

    def _make_room(self, s: Slot) -> bool:
        """The slot's context is full: shift it (drop half after n_keep) or finish it."""
        req = s.request
        assert req is not None
        if not req.context_shift:
            self._finish(s, StopReason.LENGTH)
            return False
        n_past = len(s.tokens)
        n_keep = min(max(req.n_keep, 0), n_past - 1)
        n_discard = (n_past - n_keep) // 2
        if n_discard <= 0:
            self._finish(s, StopReason.LENGTH)
            return False
        self.kv.seq_unshare(s.id)
        self.kv.seq_rm(s.id, n_keep, n_keep + n_discard)
        self.kv.seq_add(s.id, n_keep + n_discard, n_past, -n_discard, self._shift_k)
        s.tokens = s.tokens[:n_keep] + s.tokens[n_keep + n_discard :]
        return True

    # -- endings -----------------------------------------------------------------------------------------

    def fail_all(self, message: str) -> None:
        for s in self.slots:
            if s.state != SlotState.IDLE:
                self._finish(s, StopReason.ERROR, error=message)

    def fail(self, s: Slot, message: str) -> None:
        self._finish(s, StopReason.ERROR, error=message)

    def _finish(self, s: Slot, reason: StopReason, stop_word: str = "", error: str = "") -> None:
        assert s.request is not None and s.emit is not None
        tail = ""
        if reason not in (StopReason.STOP_WORD, StopReason.ERROR, StopReason.CANCELLED):
            tail = s.held + s.detok.flush()  # type: ignore[attr-defined]
        s.emit(self._final(s, s.request, reason, stop_word=stop_word, error=error, text=tail, emit_slot=s.id))
        s.state = SlotState.IDLE
        s.request = s.emit = s.sampler = s.detok = None
        s.held = ""

    def _final(
        self,
        s: Slot | None,
        req: GenerationRequest,
        reason: StopReason,
        stop_word: str = "",
        error: str = "",
        text: str = "",
        emit_slot: int = -1,
    ) -> FinalEvent:
        now = time.perf_counter()
        if s is None:
            timings = Timings(0, 0.0, 0, 0.0, 0)
            usage = Usage(len(req.prompt), 0, 0)
        else:
            timings = self._timings(s, now)
            usage = Usage(s.n_prompt, s.n_generated, s.n_cached)
        return FinalEvent(reason, usage, timings, text=text, stop_word=stop_word, error=error, slot=emit_slot)

    @staticmethod
    def _timings(s: Slot, now: float) -> Timings:
        t_prompt = (s.t_prompt_done or now) - s.t_start
        t_gen = now - s.t_prompt_done if s.t_prompt_done else 0.0
        return Timings(s.n_prompt - s.n_cached, t_prompt * 1e3, s.n_generated, t_gen * 1e3, s.n_cached)


def _split_stop(text: str, stops: list[str]) -> tuple[str, str, str]:
    """(text to emit now, text to hold back, matched stop string).

    A full match cuts the text before the stop string. Otherwise the longest tail of the text that is a
    prefix of some stop string is held back, so a partial stop string never reaches the client.
    """
    if not stops:
        return text, "", ""
    first = -1
    word = ""
    for stop in stops:
        if not stop:
            continue
        i = text.find(stop)
        if i >= 0 and (first < 0 or i < first):
            first, word = i, stop
    if first >= 0:
        return text[:first], "", word
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return (text[: len(text) - hold], text[len(text) - hold :], "") if hold else (text, "", "")
