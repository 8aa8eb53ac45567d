"""The speculator: every drafter of an engine, each step's drafts for all generating slots, the verifiers.

The scheduler calls `propose(slots)` before it plans a step: every slot that is generating gets a draft
(the first drafter in llama.cpp's priority order that proposes something for it wins, the others are
skipped for that slot), all drafting slots at once so the draft model runs one batch for them all. The
drafts are verified in the target's next forward pass beside the other slots' work. After the pass the
scheduler asks `chooser(slot)` how to pick each verified position's token (None: sample and match) and
reports the accepted count with `accepted(...)`. Each slot's draft length adapts to what the target
accepted (`backoff`: shorter drafts, then none for a while, after rejections).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..sampling import LLAMA_DEFAULT_SEED, Sampler
from ..sampling.rng import resolve_seed
from ..slot import SlotState
from ..tokenizer import Tokenizer
from .backoff import Backoff
from .config import SpecType, SpeculativeConfig
from .draft_model import DraftModel
from .drafter import Drafter, DraftJob
from .ngram import NgramMap, NgramSimple
from .ngram_cache import NgramCache
from .ngram_mod import NgramMod
from .verify import RejectionVerifier, SyntheticVerifier

if TYPE_CHECKING:
    from ..requests import GenerationRequest
    from ..slot import Slot

__all__ = ["SpecStats", "Speculator"]


@dataclass(slots=True)
class SpecStats:
    """Engine-wide counters (llama.cpp's `spec_decode_*` metrics)."""

    n_draft_tokens: int = 0  # drafted tokens verified
    n_accepted: int = 0  # of those, accepted
    n_drafts: int = 0  # verification steps
    accepted_per_pos: list[int] = field(default_factory=list)  # accepted drafts at each draft position


@dataclass(slots=True, eq=False)
class _SeqState:
    request: GenerationRequest | None = None  # the request this state belongs to
    drafter: Drafter | None = None  # who proposed the current draft
    q: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    synthetic: SyntheticVerifier | None = None
    rejection: RejectionVerifier | None = None
    backoff: Backoff | None = None  # the adaptive draft limit (None: `adaptive` off)


class Speculator:
    """Drafters, per-slot speculative state and counters of one engine."""

    def __init__(
        self,
        config: SpeculativeConfig,
        tokenizer: Tokenizer,
        n_seq: int,
        n_ctx: int,
        n_batch: int,
        kernels: object = None,
        exact_floats: bool | None = None,
    ) -> None:
        self.config = config.validate()
        self._exact_floats = exact_floats  # the draft model's float kernels: the target's mode
        self.tokenizer = tokenizer
        self.draft_model: DraftModel | None = None
        self.drafters: list[tuple[SpecType, Drafter]] = [
            (t, self._make(t, tokenizer, n_seq, n_ctx, n_batch, kernels)) for t in config.enabled
        ]
        self.n_max = max((d.n_max for _, d in self.drafters), default=0)
        self.synth_probs = config.synth_probs()
        self.stats = SpecStats(accepted_per_pos=[0] * self.n_max)
        self._seqs = [_SeqState() for _ in range(n_seq)]

    def _make(
        self, t: SpecType, tok: Tokenizer, n_seq: int, n_ctx: int, n_batch: int, kernels: object
    ) -> Drafter:
        c = self.config
        if t == SpecType.DRAFT_SIMPLE:
            self.draft_model = DraftModel(c.draft, tok, n_seq, n_ctx, n_batch, kernels, self._exact_floats)
            return self.draft_model
        if t == SpecType.NGRAM_SIMPLE:
            return NgramSimple(c.ngram_simple)
        if t == SpecType.NGRAM_MAP_K:
            return NgramMap(c.ngram_map_k, key_only=True)
        if t == SpecType.NGRAM_MAP_K4V:
            return NgramMap(c.ngram_map_k4v, key_only=False)
        if t == SpecType.NGRAM_MOD:
            return NgramMod(c.ngram_mod)
        assert t == SpecType.NGRAM_CACHE
        return NgramCache(c.lookup_cache_static, c.lookup_cache_dynamic)

    # -- lifecycle ---------------------------------------------------------------------------------------

    def warmup(self) -> None:
        if self.draft_model is not None:
            self.draft_model.warmup()

    def close(self) -> None:
        """Write what must outlive the process (the dynamic lookup cache, when `-lcd` was given)."""
        for _, d in self.drafters:
            if isinstance(d, NgramCache):
                d.close()

    # -- drafting ----------------------------------------------------------------------------------------

    def propose(self, slots: list[Slot], n_ctx_slot: int) -> None:
        """Draft for every generating slot that has no draft yet (one batch of draft-model work)."""
        jobs: list[DraftJob] = []
        for s in slots:
            if s.state != SlotState.GENERATE or s.request is None or s.sampler is None or s.drafts:
                continue
            n_max = self._n_draft_max(s, n_ctx_slot)
            if n_max <= 0:
                continue
            st = self._begin_if_new(s)
            if st.backoff is not None:
                n_max = min(n_max, st.backoff.allow())
                if n_max <= 0:  # backing off after failed drafts
                    continue
            sp = s.request.sampling
            want_q = self.config.draft.probabilistic and sp.temperature > 0
            jobs.append(DraftJob(s.id, s.tokens, s.next_token, n_max, want_q, sp.temperature, sp.seed))
            st.drafter, st.q = None, []
        pending = jobs
        for _, drafter in self.drafters:
            if not pending:
                break
            drafter.draft(pending)
            for job in pending:
                if job.result:
                    del job.result[job.n_max :]
                    del job.q[job.n_max :]
                    self._seqs[job.seq].drafter = drafter
            pending = [j for j in pending if not j.result]
        for job in jobs:
            if job.result:
                slots[job.seq].drafts = job.result
                self._seqs[job.seq].q = job.q

    @staticmethod
    def _n_draft_max(s: Slot, n_ctx_slot: int) -> int:
        """What may be drafted: room in the slot's context (one cell kept for a shift) and, under a token
        limit, one fewer than the tokens left (verification adds one token of its own)."""
        assert s.request is not None
        n = n_ctx_slot - len(s.tokens) - 2
        if s.request.max_tokens > 0:
            n = min(n, s.request.max_tokens - s.n_generated - 1)
        return n

    def _begin_if_new(self, s: Slot) -> _SeqState:
        st = self._seqs[s.id]
        if st.request is not s.request:
            assert s.request is not None and s.sampler is not None
            st.request = s.request
            st.synthetic = st.rejection = None
            seed = s.request.sampling.seed
            if self.synth_probs:
                seed = resolve_seed(seed) if seed == LLAMA_DEFAULT_SEED else seed
                st.synthetic = SyntheticVerifier(self.synth_probs, seed, self.tokenizer.eog_ids)
            if self.config.draft.probabilistic:
                st.rejection = RejectionVerifier(s.sampler.seed)
            st.backoff = self._new_backoff()
            for _, d in self.drafters:
                d.begin(s.id, s.tokens, s.request.cache_scope)
        return st

    def _new_backoff(self) -> Backoff | None:
        if not self.config.adaptive or self.n_max <= 0:
            return None
        # a draft model drafting fewer than its n_min proposes nothing: the limit never goes below it
        floor = self.config.draft.n_min if self.draft_model is not None else 1
        return Backoff(self.n_max, floor)

    def backoff_of(self, seq: int) -> Backoff | None:
        """The adaptive draft limit of sequence `seq` for its current request (None when off)."""
        return self._seqs[seq].backoff

    # -- verification ------------------------------------------------------------------------------------

    def chooser(self, s: Slot, n_drafts: int):
        """A function `(sampler, row, drafts, i) -> (token, keep)` for this slot's verified positions, or
        None for plain verification (sample and match). Grammar-constrained requests and requests for
        token probabilities always verify plainly."""
        st = self._seqs[s.id]
        req = s.request
        if req is None or req.sampling.n_probs > 0 or req.sampling.grammar or n_drafts == 0:
            return None
        if st.synthetic is not None:
            syn = st.synthetic

            def synthetic(sampler: Sampler, row: np.ndarray, drafts: list[int], i: int) -> tuple[int, bool]:
                return syn.choose(sampler, row, drafts[i], i)

            return synthetic
        if st.rejection is not None and len(st.q) >= n_drafts and req.sampling.temperature > 0:
            rej, q = st.rejection, st.q

            def rejection(sampler: Sampler, row: np.ndarray, drafts: list[int], i: int) -> tuple[int, bool]:
                return rej.choose(sampler, row, drafts[i], q[i])

            return rejection
        return None

    def accepted(self, seq: int, n_drafted: int, n_accepted: int) -> None:
        """The target verified `n_drafted` drafts of `seq` and kept `n_accepted`."""
        st = self._seqs[seq]
        stats = self.stats
        stats.n_draft_tokens += n_drafted
        stats.n_accepted += n_accepted
        stats.n_drafts += 1
        for i in range(min(n_accepted, len(stats.accepted_per_pos))):
            stats.accepted_per_pos[i] += 1
        for _, d in self.drafters:
            d.accept(seq, n_accepted, d is not st.drafter)
        if st.backoff is not None:
            st.backoff.update(n_drafted, n_accepted)
        st.drafter, st.q = None, []

    def shifted(self, seq: int, n_keep: int, n_discard: int, n_past: int) -> None:
        """The target shifted the context of `seq` (drop n_discard tokens after n_keep)."""
        if self.draft_model is not None:
            self.draft_model.shift(seq, n_keep, n_discard, n_past)
