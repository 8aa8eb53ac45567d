"""Continuous batching: which tokens of which requests go into the next forward pass.

A step is three calls (nano-vllm's shape, vLLM v1's contract): `schedule()` returns one `Step` saying,
for each request, how many tokens it runs under one token budget (`n_batch`): first one decode token per
generating slot (plus any drafts to verify), then prompt chunks and embedding chunks, oldest first. The
model runs `step.batch`, and `postprocess(step, logits, hidden)` records what the cache now holds,
samples, detokenizes, checks stop conditions, emits events and pools finished embeddings.

A new request takes the idle slot whose cached tokens share the longest prefix with its prompt, and may
also borrow a longer cached prefix from any other slot (`seq_cp`: the cells are shared, not recomputed).
Only caches of the request's own scope (`GenerationRequest.cache_scope`, the API key) count: another
scope's cached tokens neither attract a request nor serve it, and a slot holding them starts from zero.
Embedding jobs take turns on one scratch sequence (`n_parallel`), so their cache use stays bounded by
one slot's context. A request with DRY sampling waits in the queue, without stalling the others, while
DRY's vocabulary table is built on a background thread (once, when the first such request arrives);
likewise a request with a grammar waits for the grammar's view of the vocabulary (its token trie).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from .batch import Batch
from .cache_reuse import can_reuse_chunks, reuse_chunks
from .checkpoints import DEFAULT_CHECKPOINTS, CheckpointConfig, Checkpoints
from .embedding import EmbeddingJob
from .grammar import GrammarError, GrammarStopError
from .grammar.matcher import GrammarMatcher, request_matcher
from .grammar.vocab import GrammarVocab
from .handles import Embed, Generate, RequestCancelledError
from .kv_cache import KVCache
from .progress import progress_event
from .requests import FinalEvent, GenerationRequest, StopReason, Timings, TokenEvent, Usage
from .sampling import DryVocab, Sampler, SamplingParams
from .sampling.reasoning_budget import piece_complete
from .slot import NO_REQUEST, Parked, Slot, SlotState, common_prefix, lora_key, shift_sizes
from .step import Step, StepBuilder, drafts_that_fit
from .tokenizer import Tokenizer
from .vocab_tables import build_dry_vocab, in_background

if TYPE_CHECKING:
    from .prompt_cache import PromptCache
    from .speculative import Speculator

__all__ = ["Scheduler"]

log = logging.getLogger("llama_engine")

CONTENDED_S = 30.0  # seconds after requests last ran side by side during which every prompt step is capped


def _left(w: Slot | EmbeddingJob) -> int:
    """Prompt tokens a prefilling slot or embedding job still has to run."""
    return w.n_left if isinstance(w, EmbeddingJob) else len(w.prompt) - len(w.tokens)


class Scheduler:
    """Slots, the waiting queue, embedding jobs, and each step's planning and result handling."""

    def __init__(
        self,
        kv: KVCache,
        tokenizer: Tokenizer,
        n_vocab: int,
        n_parallel: int,
        n_ctx_slot: int,
        n_batch: int,
        shift_k: Callable[[int, np.ndarray, np.ndarray, int], None],
        wake: Callable[[], None] = lambda: None,
        checkpoints: CheckpointConfig = DEFAULT_CHECKPOINTS,
    ) -> None:
        self.kv = kv
        self.tokenizer = tokenizer
        self.n_vocab = n_vocab
        self.slots = [Slot(i) for i in range(n_parallel)]
        self.embd_seq = n_parallel  # the scratch sequence embedding jobs take turns on
        self.n_ctx_slot = n_ctx_slot
        self.n_batch = n_batch
        self.waiting: deque[Generate] = deque()
        self.embeddings: deque[EmbeddingJob] = deque()  # the first one holds the embedding sequence
        self._shift_k = shift_k
        self._wake = wake  # called from another thread when something a waiting request needs is ready
        self._dry_vocab: Future[DryVocab] | None = None
        self._grammar_vocab: Future[GrammarVocab] | None = None
        self._eog = sorted(tokenizer.eog_ids)
        self._builder = StepBuilder(n_parallel + 1, n_batch, n_ctx_slot)
        self.checkpoints = Checkpoints(kv, checkpoints, n_batch)  # prompt states a window cannot keep
        # prompt and embedding tokens a step may add to decode tokens (the engine sizes it from measured
        # step times, so streams keep a steady pace beside a long prompt); n_batch: no bound
        self.prefill_cap = n_batch
        self._alone = False  # the previous step ran short prompts without the long ones (`schedule`)
        self._contended_at = -CONTENDED_S  # when requests last ran side by side (`_contended`)
        # "fcfs": waiting requests take free slots in arrival order; "priority": by (priority, arrival), and
        # one that finds no free slot preempts a running request of a higher priority value (vLLM's policy)
        self.policy = "fcfs"
        self.n_preemptions = 0
        self.speculator: Speculator | None = None  # drafts for generating slots (speculative decoding)
        self.prompt_cache: PromptCache | None = None  # slot caches saved to host RAM (--cache-ram)
        self.rank_head: Callable[[np.ndarray], np.ndarray] | None = None  # rank pooling's classifier
        self.step_lora: tuple[float, ...] = ()  # the adapter scales of the step `schedule` planned
        # runs a batch through the model for its cache alone (a recurrent state rolled back re-absorbs
        # the tokens kept); the engine sets it
        self.replay: Callable[[Batch], object] | None = None
        self._replays: list[tuple[int, int]] = []  # (slot, first position) of this step's rollbacks
        # a prompt step stopped between layers for a newcomer (`suspend`): its sequences, each with its
        # chunk's first position; they are not scheduled until the engine resumes (or abandons) the step
        self.suspended: dict[int, int] = {}
        self._suspension_broken = False  # one of them ended or was preempted meanwhile
        kv.pin(self.suspended.keys())  # their cells stay while they wait

    # -- admission ---------------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        """Something to run or admit now (a request waiting for DRY's table being built does not count:
        the loop is woken when it is ready)."""
        if self.embeddings or any(s.state != SlotState.IDLE for s in self.slots):
            return True
        return any(self._tables_ready(m.request.sampling) for m in self.waiting)

    def _tables_ready(self, p: SamplingParams) -> bool:
        """Whether the vocabulary tables a request needs are built (None: built when it is admitted)."""
        for needed, table in (
            (p.dry_multiplier != 0, self._dry_vocab),
            (bool(p.grammar), self._grammar_vocab),
        ):
            if needed and (table is None or not table.done()):
                return False
        return True

    def add(self, msg: Generate | Embed) -> None:
        """Queue a generation (admitted to a slot by `admit`) or an embedding job."""
        if isinstance(msg, Generate):
            self.waiting.append(msg)
        else:
            self.embeddings.append(EmbeddingJob(msg.request, msg.handle, msg.arrival))

    def admit(self) -> None:
        """Move waiting requests into idle slots; under the `priority` policy, in priority order, preempting
        running requests of lower priority when no slot is free."""
        if self.policy == "priority":
            self.waiting = deque(sorted(self.waiting, key=lambda m: (m.request.priority, m.arrival)))
        self._admit()
        while self.policy == "priority" and self.waiting and self._preempt_for(self.waiting):
            self._admit()

    def _admit(self) -> None:
        still: deque[Generate] = deque()
        while self.waiting:
            msg = self.waiting.popleft()
            req = msg.request
            if msg.handle.cancelled.is_set():
                msg.handle._emit(self._final(None, req, StopReason.CANCELLED))
                continue
            dry = self._dry_ready() if req.sampling.dry_multiplier != 0 else None
            if dry is False:
                still.append(msg)
                continue
            if isinstance(dry, BaseException):
                msg.handle._emit(self._final(None, req, StopReason.ERROR, error=f"DRY: {dry}"))
                continue
            grammar = self._grammar_ready() if req.sampling.grammar and msg.parked is None else None
            if grammar is False:
                still.append(msg)
                continue
            if isinstance(grammar, BaseException):
                msg.handle._emit(self._final(None, req, StopReason.ERROR, error=f"grammar: {grammar}"))
                continue
            slot = self._pick_slot(req)
            if slot is None:
                still.append(msg)
                continue
            try:
                matcher = (
                    self._matcher(req.sampling) if msg.parked is None else None
                )  # a parked one has its own
            except (GrammarError, ValueError) as e:
                msg.handle._emit(self._final(None, req, StopReason.ERROR, error=str(e)))
                continue
            self._start(slot, msg, matcher)
            if self.prompt_cache is not None:
                self.prompt_cache.after_start(self.slots, self.checkpoints)
        self.waiting = still

    # -- preemption (the `priority` policy) ----------------------------------------------------------------

    def _preempt_for(self, waiting: deque[Generate]) -> bool:
        """Free a slot for the first waiting request that outranks a running one; True when one was freed."""
        for msg in waiting:
            if msg.handle.cancelled.is_set() or (
                msg.parked is None and not self._tables_ready(msg.request.sampling)
            ):
                continue  # not admissible now: a slot freed for it would go to another
            want = msg.request.priority
            running = [
                s
                for s in self.slots
                if s.state != SlotState.IDLE
                and s.request is not None
                and s.request.priority > want
                and (msg.request.slot < 0 or s.id == msg.request.slot)
            ]
            if running:  # the lowest priority, then the newest: it has the least work to lose
                victim = max(running, key=lambda s: (s.request.priority, s.arrival))  # type: ignore[union-attr]
                self._preempt(victim)
                return True
            if msg.request.slot < 0 or self.slots[msg.request.slot].state == SlotState.IDLE:
                return False  # the first in line finds nothing to preempt: neither will those after it
        return False

    def _preempt(self, s: Slot) -> None:
        """Set a running request aside, queued again at its arrival: one still evaluating its prompt starts
        over (its evaluated part stays in the cache for reuse); a generating one is parked with its sampler
        and resumes from its next token. Its cells stay with the idle slot, where the prompt cache saves
        them before another request overwrites them."""
        assert s.request is not None and s.handle is not None
        self._unsuspend(s)
        handle = s.handle
        if s.state == SlotState.PROMPT:
            again = Generate(s.request, handle, s.arrival)  # type: ignore[arg-type]
        else:
            parked = Parked.of(s)
            resume = msgspec.structs.replace(
                s.request, prompt=list(s.tokens), return_progress=False, cache_prompt=True, slot=-1
            )
            again = Generate(resume, handle, s.arrival, parked)  # type: ignore[arg-type]
        self.n_preemptions += 1
        log.info("slot %d: request preempted by one of higher priority (%d tokens kept)", s.id, len(s.tokens))
        s.state = SlotState.IDLE
        s.request = s.emit = s.sampler = s.detok = s.handle = None
        s.held, s.drafts, s.cancelled, s.parked = "", [], NO_REQUEST, None
        self.waiting.append(again)

    def set_dry_vocab(self, table: Future[DryVocab]) -> None:
        """Use this DRY table (done or still being built); the loop is woken when it is ready."""
        self._dry_vocab = table
        table.add_done_callback(lambda _: self._wake())

    def _dry_ready(self) -> bool | BaseException:
        """Whether DRY's table is ready (its build starts off this thread on first use), or its error."""
        if self._dry_vocab is None:
            self.set_dry_vocab(in_background(lambda: build_dry_vocab(self.tokenizer), "llama-dry-vocab"))
        assert self._dry_vocab is not None
        if not self._dry_vocab.done():
            return False
        return self._dry_vocab.exception() or True

    def _grammar_ready(self) -> bool | BaseException:
        """Whether the grammar's vocabulary trie is ready (built off this thread on first use)."""
        if self._grammar_vocab is None:
            self._grammar_vocab = in_background(
                lambda: GrammarVocab.from_tokenizer(self.tokenizer), "llama-grammar-vocab"
            )
            self._grammar_vocab.add_done_callback(lambda _: self._wake())
        if not self._grammar_vocab.done():
            return False
        return self._grammar_vocab.exception() or True

    def _matcher(self, p: SamplingParams) -> GrammarMatcher | None:
        """A new grammar state for a request (each request starts its grammar afresh)."""
        if not p.grammar:
            return None
        assert self._grammar_vocab is not None
        return request_matcher(
            p.grammar,
            self._grammar_vocab.result(),
            lazy=p.grammar_lazy,
            triggers=p.grammar_triggers,
            prefill=p.grammar_prefill,
            token_id=self.token_of,
        )

    def token_of(self, text: str) -> int | None:
        """The one token that ``text`` (special tokens parsed) is, or None (grammar ``<name>``)."""
        ids = self.tokenizer.encode(text, add_special=False, parse_special=True)
        return ids[0] if len(ids) == 1 else None

    def _pick_slot(self, req: GenerationRequest) -> Slot | None:
        if req.slot >= 0:
            s = self.slots[req.slot]
            return s if s.state == SlotState.IDLE else None
        idle = [s for s in self.slots if s.state == SlotState.IDLE]
        if not idle:
            return None
        key = lora_key(req.lora)  # a cache computed under other adapters shares nothing
        scope = req.cache_scope  # nor one of another scope: its match must not even steer the choice

        def score(s: Slot) -> tuple[int, float]:
            mine = s.lora == key and s.scope == scope
            return (common_prefix(s.tokens, req.prompt) if mine else 0, -s.last_used)

        return max(idle, key=score)

    def _start(self, slot: Slot, msg: Generate, grammar: GrammarMatcher | None = None) -> None:
        req = msg.request
        prompt = req.prompt
        slot.request, slot.emit, slot.cancelled = req, msg.handle._emit, msg.handle.cancelled
        slot.handle, slot.parked = msg.handle, msg.parked
        slot.prompt = np.asarray(prompt, np.int32)
        slot.arrival, slot.t_start = msg.arrival, time.perf_counter()
        slot.n_prompt = len(prompt)
        slot.n_generated, slot.held, slot.next_token, slot.drafts = 0, "", -1, []
        slot.n_drafted = slot.n_draft_accepted = 0
        slot.truncated = False
        key, scope = lora_key(req.lora), req.cache_scope
        if self.prompt_cache is not None and req.cache_prompt:
            self.prompt_cache.before_start(slot, prompt, key, self.checkpoints, scope)
        if slot.lora != key or slot.scope != scope:  # computed under other adapters or for another scope
            self.kv.seq_rm(slot.id)
            self.checkpoints.clear(slot.id)
            slot.tokens, slot.lora, slot.scope = [], key, scope
        reused = self._reuse_prefix(slot, prompt, req.n_cache_reuse) if req.cache_prompt else 0
        if not req.cache_prompt:
            self.kv.seq_rm(slot.id)
        slot.tokens = list(prompt[:reused])
        slot.n_cached = reused
        self.checkpoints.keep_below(slot.id, reused)
        slot.state = SlotState.PROMPT
        if msg.parked is not None:  # preempted: its cache is evaluated again, then it goes on as it was
            return
        params = req.sampling
        vocab = self._dry_vocab.result() if params.dry_multiplier != 0 and self._dry_vocab else None
        slot.sampler = msg.handle.sampler = Sampler(  # the handle's: a control request reaches the budget
            params,
            self.n_vocab,
            vocab=vocab,
            eog_tokens=self._eog,
            n_ctx=self.n_ctx_slot,
            grammar=grammar,
            complete=piece_complete(self.tokenizer) if params.reasoning_budget is not None else None,
        )
        slot.sampler.accept_many(prompt)
        slot.detok = self.tokenizer.streaming(req.special)
        if req.return_progress:  # llama.cpp's first update: nothing evaluated yet (processed == cache)
            msg.handle._emit(progress_event(slot, start=True))

    def _reuse_prefix(self, slot: Slot, prompt: list[int], n_cache_reuse: int = 0) -> int:
        own = common_prefix(slot.tokens, prompt)
        best, donor = own, None
        for other in self.slots:
            if other is not slot and other.tokens and other.lora == slot.lora and other.scope == slot.scope:
                n = common_prefix(other.tokens, prompt)
                if n > best:
                    best, donor = n, other
        limit = len(prompt) - 1  # the last prompt token is always evaluated: its logits are needed
        if donor is not None:
            self.kv.seq_rm(slot.id)
            self.kv.seq_cp(donor.id, slot.id, 0, min(best, limit))
            slot.tokens = list(prompt[: min(best, limit)])
            self.checkpoints.adopt(slot.id, donor.id)
        n = min(best, limit)
        if n_cache_reuse > 0 and donor is None and self.speculator is None and can_reuse_chunks(self.kv):
            n = min(
                limit, reuse_chunks(self.kv, slot.id, slot.tokens, prompt, n, n_cache_reuse, self._shift_k)
            )
        self.kv.seq_rm(slot.id, n)
        kept = self.kv.reusable_prefix(slot.id, n)
        if kept < n:  # a window moved past the prefix: resume from a checkpoint, if one is usable
            kept = max(kept, self.checkpoints.restore(slot.id, n))
            self.kv.seq_rm(slot.id, kept)
        return kept

    # -- one step: schedule ------------------------------------------------------------------------------

    def schedule(self) -> Step | None:
        """This step's plan under the budget: decode tokens first, then prompt and embedding chunks
        (oldest first). None when there is nothing to run. Cancellations are honoured here."""
        self._drop_cancelled()
        if self.speculator is not None:  # every generating slot's draft, in one batch of drafting work
            self.speculator.propose(self.slots, self.n_ctx_slot)
        b = self._builder
        b.begin()
        key = self.step_lora = self._next_lora()
        for s in self.slots:
            if s.state == SlotState.GENERATE and b.room > 0 and s.lora == key:
                self._schedule_decode(s)
        prefill: list[Slot | EmbeddingJob] = [
            s
            for s in self.slots
            if s.state == SlotState.PROMPT and s.lora == key and s.id not in self.suspended
        ]
        if self.embeddings and lora_key(self.embeddings[0].request.lora) == key:
            prefill.append(self.embeddings[0])
        contended = self._contended()  # first: it notes this step's company
        if b.room < self.n_batch or len(prefill) > 1 or contended:
            b.cap(self.prefill_cap)  # others wait, or are likely to arrive, for this step: keep it short
        # when not all of it fits, prompts that finish within a fraction of the step run in a step of
        # their own (every other step at most, so a long prompt beside a stream of short ones still
        # advances): their first token does not wait for another prompt's chunk
        small = max(self.prefill_cap // 4, 32)
        short: list[Slot | EmbeddingJob] = [w for w in prefill if isinstance(w, Slot) and _left(w) <= small]
        crowded = sum(_left(w) for w in prefill) > b.room
        self._alone = crowded and bool(short) and len(short) < len(prefill) and not self._alone
        if self._alone:
            prefill = short
        # the budget shared fairly (water-filling): the shortest remaining prompts first, each taking at
        # most an even share of what is left, so a short prompt is not held behind another's long one
        prefill.sort(key=lambda w: (_left(w), w.arrival))
        embedding = 0  # tokens of the embedding chunk: budgeted with the others, placed last
        for i, w in enumerate(prefill):
            if b.room == 0:
                break
            share = max(b.room // (len(prefill) - i), 1)
            if isinstance(w, Slot):
                self._schedule_prompt(w, share)
            else:
                embedding = min(w.n_left, share)
                b.reserve(embedding)
        if embedding:
            self._schedule_embedding(self.embeddings[0], embedding)
        return b.finish()

    def _contended(self) -> bool:
        """Whether requests have recently run side by side (within CONTENDED_S): then a prompt running alone
        is also chunked short, since another request is likely to arrive during its step. A lone user's
        long prompt keeps whole `n_batch` chunks (a mixture-of-experts model reads its experts once per step:
        short chunks would cost it most)."""
        now = time.perf_counter()
        active = sum(s.state != SlotState.IDLE for s in self.slots) + len(self.waiting) + len(self.embeddings)
        if active > 1:
            self._contended_at = now
        return len(self.slots) > 1 and now - self._contended_at < CONTENDED_S

    def _next_lora(self) -> tuple[float, ...]:
        """The adapter scales this step runs: work under different scales is never batched together, so
        each set takes its turn (round robin over the sets running work has)."""
        keys = {s.lora for s in self.slots if s.state != SlotState.IDLE}
        if self.embeddings:
            keys.add(lora_key(self.embeddings[0].request.lora))
        if len(keys) <= 1:
            return keys.pop() if keys else ()
        order = sorted(keys)
        later = [k for k in order if k > self.step_lora]
        return later[0] if later else order[0]

    # -- a suspended prompt step ---------------------------------------------------------------------------

    def suspend(self, step: Step) -> None:
        """The step's forward pass stopped between layers, to go on after a newcomer's step: its sequences
        wait (their cells stay placed, kept from a window's reclaiming: `KVCache.pin`)."""
        for q in step.seqs:
            self.suspended[q] = int(step.batch.pos[step.offset[q]])

    def resumable(self) -> bool:
        """Whether every sequence of the suspended step still waits for it."""
        return bool(self.suspended) and not self._suspension_broken

    def resumed(self) -> None:
        """The suspended step ran to its end (its results go through `postprocess`)."""
        self.suspended.clear()
        self._suspension_broken = False

    def abandon(self) -> None:
        """The suspended step will not go on: its cells are dropped, its sequences scheduled again."""
        for q, p0 in self.suspended.items():
            self.kv.seq_rm(q, p0)
        self.resumed()

    def _unsuspend(self, s: Slot) -> None:
        """A slot of the suspended step ends or is set aside: its placed cells go (before any cache of the
        idle slot is kept), and the step cannot resume."""
        p0 = self.suspended.pop(s.id, None)
        if p0 is not None:
            self.kv.seq_rm(s.id, p0)
            self._suspension_broken = True

    def _drop_cancelled(self) -> None:
        for s in self.slots:
            if s.state != SlotState.IDLE and s.cancelled.is_set():
                self._finish(s, StopReason.CANCELLED)
        if any(j.handle.cancelled.is_set() for j in self.embeddings):
            for i, j in enumerate(list(self.embeddings)):
                if j.handle.cancelled.is_set():
                    self._end_embedding(
                        j, RequestCancelledError("the embedding request was cancelled"), i == 0
                    )

    def _schedule_decode(self, s: Slot) -> None:
        if len(s.tokens) + 1 >= self.n_ctx_slot and not self._make_room(s):
            return
        room = min(self._builder.room, self.n_ctx_slot - len(s.tokens)) - 1  # for drafts
        drafts = drafts_that_fit(s.drafts, room)
        if drafts and self.kv.recurrent is not None:  # the state before the pass, should drafts be rejected
            self.kv.recurrent.snapshot(s.id)
        self._builder.add_decode(s.id, s.next_token, drafts, len(s.tokens))

    def _schedule_prompt(self, s: Slot, limit: int) -> None:
        start = len(s.tokens)
        n = self.checkpoints.chunk(start, min(len(s.prompt) - start, limit), len(s.prompt))
        self.checkpoints.before_chunk(s.id, s.t_start, start, n, len(s.prompt), start == s.n_cached)
        last = start + n == len(s.prompt)
        self._builder.add_chunk(
            s.id, s.prompt[start : start + n], start, n - 1 if last else 0, n if last else 0
        )

    def _schedule_embedding(self, job: EmbeddingJob, n: int) -> None:
        """The job's next n tokens (reserved), last in the batch: its rows need no logits."""
        lo, hi = job.out_range(n)
        chunk = job.prompt[job.n_done : job.n_done + n]
        self._builder.add_chunk(self.embd_seq, chunk, job.n_done, lo, hi, logits=False, reserved=True)

    # -- one step: postprocess ---------------------------------------------------------------------------

    def postprocess(self, step: Step, logits: np.ndarray, hidden: np.ndarray) -> None:
        """The step ran: record what the cache holds, sample each output row, pool finished embeddings.

        logits: [batch.n_logits, n_vocab] (the generation rows; embedding rows come last and have none),
        hidden: [n_out, n_embd], the step's output rows in batch order."""
        now = time.perf_counter()
        for q in step.seqs:
            n, o = step.n_tokens[q], step.out_offset[q]
            if q == self.embd_seq:
                job = self.embeddings[0]
                job.take(n, hidden[o : o + step.n_out[q]])
                if job.n_left == 0:
                    self._end_embedding(job, job.result(self.rank_head), True)
                continue
            s = self.slots[q]
            s.last_used = now
            if s.state == SlotState.GENERATE:
                self._decoded(s, logits, o, step.drafts[q])
            else:
                self._prefilled(s, n, logits[o] if step.n_out[q] else None)
        if self._replays:
            self._replay()

    def _prefilled(self, s: Slot, n: int, row: np.ndarray | None) -> None:
        assert s.request is not None
        start = len(s.tokens)
        s.tokens.extend(s.request.prompt[start : start + n])
        if s.request.return_progress:
            s.emit(progress_event(s))  # type: ignore[misc]
        if row is None:
            return
        if s.parked is not None:  # a preempted request's cache is whole again: it goes on from its next token
            s.parked.restore(s)
            s.parked = None
            return
        s.state = SlotState.GENERATE
        s.t_prompt_done = time.perf_counter()
        if s.request.max_tokens == 0:  # llama.cpp's n_predict = 0: the prompt only, no token
            self._finish(s, StopReason.LENGTH)
        else:
            self._advance(s, row)

    def _decoded(self, s: Slot, logits: np.ndarray, o: int, drafts: list[int]) -> None:
        """Sample the decode token's row; each draft that equals the token sampled before it is kept
        (its cell already holds it) and its row sampled in turn, as plain decoding would have. A
        speculator's chooser (rejection sampling, synthetic acceptance) may pick the tokens instead."""
        s.tokens.append(s.next_token)
        k, n_acc = len(drafts), 0
        choose = self.speculator.chooser(s, k) if self.speculator is not None else None
        s.n_drafted += k  # counted before a token is emitted: the final event's timings include them
        for i in range(k + 1):
            token, keep = choose(s.sampler, logits[o + i], drafts, i) if choose and i < k else (-1, True)
            self._advance(s, logits[o + i], token)
            if s.state != SlotState.GENERATE or i == k or not keep or s.next_token != drafts[i]:
                break
            s.tokens.append(drafts[i])
            n_acc += 1
            s.n_draft_accepted += 1
        if drafts:
            s.drafts = []
            if n_acc < k and self.kv.recurrent is not None:  # its state absorbed the rejected drafts too
                self._replays.append((s.id, len(s.tokens) - n_acc - 1))
            else:
                self.kv.seq_rm(s.id, len(s.tokens))  # the cells of rejected drafts
            if self.speculator is not None:
                self.speculator.accepted(s.id, k, n_acc)

    def _replay(self) -> None:
        """Roll back the recurrent state of each slot that rejected drafts: every cell of its verification
        pass is dropped, the state saved before the pass restored, and the tokens kept (the decode token
        and the accepted drafts) run again, all slots in one pass. The tokens were already chosen from the
        verification's logits; this pass only rebuilds the cache."""
        rec = self.kv.recurrent
        assert rec is not None and self.replay is not None
        parts = []
        for q, p0 in self._replays:
            self.kv.seq_rm(q, p0)
            rec.restore(q)
            kept = self.slots[q].tokens[p0:]
            parts.append(
                Batch(
                    np.asarray(kept, np.int32),
                    np.arange(p0, p0 + len(kept), dtype=np.int32),
                    np.full(len(kept), q, np.int32),
                    np.zeros(len(kept), bool),
                )
            )
        try:
            self.replay(Batch.concat(parts) if len(parts) > 1 else parts[0])
        except Exception as e:
            for q, _ in self._replays:  # the cache no longer holds what the slot's tokens say
                s = self.slots[q]
                self.kv.seq_rm(q)
                self.checkpoints.clear(q)
                s.tokens = []
                if s.state != SlotState.IDLE:
                    self.fail(s, f"internal error: {type(e).__name__}: {e}")
        finally:
            self._replays.clear()

    def undo(self, step: Step) -> None:
        """The forward pass failed: forget the cells the step placed."""
        for q in step.seqs:
            self.kv.seq_rm(q, int(step.batch.pos[step.offset[q]]))

    def _end_embedding(self, job: EmbeddingJob, result: np.ndarray | BaseException, running: bool) -> None:
        self.embeddings.remove(job)
        if running:
            self.kv.seq_rm(self.embd_seq)
        job.handle._deliver(result)

    def _advance(self, s: Slot, row: np.ndarray, token: int = -1) -> None:
        """Sample the row (or take `token`, a verifier's choice), emit it, check the stop conditions."""
        req, sampler = s.request, s.sampler
        assert req is not None and sampler is not None and s.emit is not None
        n_probs = req.sampling.n_probs
        try:
            if token >= 0:
                prob, top = 0.0, []  # llama.cpp: speculatively accepted tokens carry no probabilities
            elif n_probs > 0:
                tp = sampler.sample_with_probs(row, n_probs, req.post_sampling_probs)
                token, prob, top = tp.token, tp.prob, tp.top
            else:
                token, prob, top = sampler.sample(row), 0.0, []
            sampler.accept(token)
        except (GrammarStopError, GrammarError) as e:  # the text is complete (a stop) or the grammar failed
            complete = isinstance(e, GrammarStopError) and e.complete
            self._finish(s, StopReason.EOS) if complete else self.fail(s, f"grammar: {e}")
            return
        s.n_generated += 1
        timings = self._timings(s, time.perf_counter()) if req.timings_per_token else None
        if self.tokenizer.is_eog(token) and not req.sampling.ignore_eos:
            # an event of its own (as llama-server): held-back text, the special piece only with `-sp`
            text = s.held + (s.detok.feed(token) if req.special else "")  # type: ignore[attr-defined]
            s.held = ""
            s.emit(TokenEvent(token, text, prob, top, timings))
            self._finish(s, StopReason.EOS)
            return
        preserved = token in req.sampling.preserved_tokens  # a special token whose text is output
        text = s.held + s.detok.feed(token, True if preserved else None)  # type: ignore[attr-defined]
        emit_text, s.held, stop_word = _split_stop(text, req.stop)
        s.emit(TokenEvent(token, emit_text, prob, top, timings))
        if stop_word:
            self._finish(s, StopReason.STOP_WORD, stop_word)
        elif not req.context_shift and len(s.tokens) + 1 >= self.n_ctx_slot:
            s.truncated = True  # llama.cpp stops one cell early: the next token would fill the context
            self._finish(s, StopReason.LENGTH)
        elif 0 <= req.max_tokens <= s.n_generated:
            self._finish(s, StopReason.LENGTH)
        else:
            s.next_token = token

    def _make_room(self, s: Slot) -> bool:
        """The slot's context is full: shift it (drop n_discard tokens after n_keep) or finish it."""
        req = s.request
        assert req is not None
        s.truncated = True
        n_past = len(s.tokens)
        n_keep, n_discard = shift_sizes(req, n_past, self.n_ctx_slot, self.tokenizer.add_bos)
        if req.context_shift and req.shared_prompt:  # llama.cpp never shifts one of n_cmpl > 1 choices
            self.fail(s, "context shift cannot be used for shared prompt")
            return False
        if not req.context_shift or n_discard <= 0 or not self.kv.can_shift:  # recurrent state: no shift
            self._finish(s, StopReason.LENGTH)
            return False
        self.kv.seq_unshare(s.id)
        self.kv.seq_rm(s.id, n_keep, n_keep + n_discard)
        self.kv.seq_add(s.id, n_keep + n_discard, n_past, -n_discard, self._shift_k)
        s.tokens = s.tokens[:n_keep] + s.tokens[n_keep + n_discard :]
        if self.speculator is not None:
            self.speculator.shifted(s.id, n_keep, n_discard, n_past)
        return True

    # -- endings -----------------------------------------------------------------------------------------

    def out_of_cells(self, message: str) -> None:
        """The KV cache is full: drop idle slots' cached tokens; if none, fail the newest running request
        (a generation or the running embedding job)."""
        idle = [s for s in self.slots if s.state == SlotState.IDLE and s.tokens]
        if idle:
            for s in idle:
                self.kv.seq_rm(s.id)
                self.checkpoints.clear(s.id)
                s.tokens = []
            return
        running: list[Slot | EmbeddingJob] = [s for s in self.slots if s.state != SlotState.IDLE]
        if self.embeddings:
            running.append(self.embeddings[0])
        if not running:
            return
        newest = max(running, key=lambda w: w.arrival)
        error = f"the KV cache is full: {message}"
        if isinstance(newest, Slot):
            self.fail(newest, error)
        else:
            self._end_embedding(newest, RuntimeError(error), True)

    def fail_all(self, message: str) -> None:
        """Fail every running request (generations and the running embedding job)."""
        for s in self.slots:
            if s.state != SlotState.IDLE:
                self._finish(s, StopReason.ERROR, error=message)
        if self.embeddings:
            self._end_embedding(self.embeddings[0], RuntimeError(message), True)

    def stop(self, message: str) -> None:
        """The engine stops: every open request, running or waiting, gets its final event (an error)."""
        self.fail_all(message)
        while self.waiting:
            msg = self.waiting.popleft()
            msg.handle._emit(self._final(None, msg.request, StopReason.ERROR, error=message))
        while self.embeddings:
            self._end_embedding(self.embeddings[0], RuntimeError(message), False)

    def fail(self, s: Slot, message: str) -> None:
        self._finish(s, StopReason.ERROR, error=message)

    def _finish(self, s: Slot, reason: StopReason, stop_word: str = "", error: str = "") -> None:
        assert s.request is not None and s.emit is not None
        self._unsuspend(s)
        tail = ""
        if reason not in (StopReason.STOP_WORD, StopReason.ERROR, StopReason.CANCELLED):
            tail = s.held + s.detok.flush()  # type: ignore[attr-defined]
        final = self._final(s, s.request, reason, stop_word=stop_word, error=error, text=tail, emit_slot=s.id)
        emit = s.emit
        # idle before the final event leaves: a client that reads it and asks for the slots sees it free
        s.state = SlotState.IDLE
        s.request = s.emit = s.sampler = s.detok = s.handle = None
        s.held, s.drafts, s.cancelled, s.parked = "", [], NO_REQUEST, None
        emit(final)

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
        cut = s is not None and s.truncated
        return FinalEvent(reason, usage, timings, text, stop_word, error, emit_slot, cut)

    @staticmethod
    def _timings(s: Slot, now: float) -> Timings:
        t_prompt = (s.t_prompt_done or now) - s.t_start
        t_gen = now - s.t_prompt_done if s.t_prompt_done else 0.0
        n_prompt, n_gen = s.n_prompt - s.n_cached, s.n_generated
        return Timings(
            n_prompt, t_prompt * 1e3, n_gen, t_gen * 1e3, s.n_cached, s.n_drafted, s.n_draft_accepted
        )


def _split_stop(text: str, stops: list[str]) -> tuple[str, str, str]:
    """(text to emit now, text to hold back, matched stop string).

    A full match cuts the text before the stop string. Otherwise the longest tail of the text that is a
    prefix of some stop string is held back, so a partial stop string never reaches the client.
    """
    if not stops:
        return text, "", ""
    first, word = -1, ""
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
