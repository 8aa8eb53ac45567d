"""draft-simple: a small model of the same vocabulary drafts tokens, all drafting sequences in one batch.

The draft model has its own KV cache (`-ctkd/-ctvd` types) with one sequence per slot and remembers what
each holds. A draft first brings the sequence up to date (what the target accepted since: usually one or
two tokens, a whole prompt the first time), then runs one forward per drafted position for every sequence
still drafting. Drafted tokens stay in the draft cache; the next draft keeps the part the target accepted
(a common prefix) and drops the rest, so the cache rolls back exactly as the target's does. A draft model
with recurrent layers cannot drop drafted tokens from its state: the state is saved once a sequence is up
to date, and the next draft restores it and runs the accepted tokens again.

Greedy drafting takes the best of the top 10 candidates and stops below `p_min`; probabilistic drafting
samples them at the target's temperature (its own seeded generator) and hands the candidate distribution
to rejection sampling.
"""

from __future__ import annotations

import numpy as np

from gguf_io import GGUFFile
from gguf_io import open as open_gguf

from ..arch import DecoderModel, load_model
from ..batch import Batch
from ..kv_cache import KVCacheFullError
from ..kv_types import resolve_flash_attn
from ..sampling import LLAMA_DEFAULT_SEED
from ..tokenizer import Tokenizer
from .config import DraftParams
from .drafter import DraftJob

__all__ = ["DraftModel", "check_compatible"]

_TOP_K = 10  # llama.cpp's draft sampler keeps the 10 best candidates
_SEED_MIX = 0x85EBCA6B  # the draft's seed differs from the target's (llama.cpp's spec_retune)
_VOCAB_MAX_DIFF = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
_VOCAB_CHECK_FROM = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID


def check_compatible(target: Tokenizer, draft: Tokenizer) -> None:
    """llama.cpp's common_speculative_are_compatible; ValueError saying what differs."""
    why = _incompatibility(target, draft)
    if why:
        raise ValueError(
            f"the draft model cannot be used for speculative decoding: {why} "
            "(draft model vocab type must match target model to use speculation)"
        )


def _incompatibility(t: Tokenizer, d: Tokenizer) -> str:
    if t.vocab.type != d.vocab.type:
        return f"vocabulary types differ (target {t.vocab.type.name}, draft {d.vocab.type.name})"
    if t.add_bos != d.add_bos or (t.add_bos and t.bos_id != d.bos_id):
        return f"BOS tokens differ (target {t.bos_id}, draft {d.bos_id})"
    if t.add_eos != d.add_eos or (t.add_eos and t.eos_id != d.eos_id):
        return f"EOS tokens differ (target {t.eos_id}, draft {d.eos_id})"
    if abs(t.n_vocab - d.n_vocab) > _VOCAB_MAX_DIFF:
        return f"vocabulary sizes differ too much (target {t.n_vocab}, draft {d.n_vocab})"
    for i in range(_VOCAB_CHECK_FROM, min(t.n_vocab, d.n_vocab)):
        if t.token_text(i) != d.token_text(i):
            return f"token {i} is {t.token_text(i)!r} in the target and {d.token_text(i)!r} in the draft"
    return ""


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    x = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(x[0])


class DraftModel:
    """The draft-simple drafter: its own model, KV cache and forward passes."""

    def __init__(
        self,
        params: DraftParams,
        target: Tokenizer,
        n_seq: int,
        n_ctx: int,
        n_batch: int,
        kernels: object = None,
        exact_floats: bool | None = None,
    ) -> None:
        self.params = params
        self.n_max = max(0, params.n_max)
        self.gguf: GGUFFile = open_gguf(params.model)
        self.tokenizer = Tokenizer.from_gguf(
            self.gguf.tokenizer, self.gguf.header.name, self.gguf.header.architecture
        )
        check_compatible(target, self.tokenizer)
        self.model: DecoderModel = load_model(self.gguf, kernels, exact_floats)  # type: ignore[arg-type]
        self.n_vocab = min(
            target.n_vocab, self.model.config.n_vocab
        )  # drafts stay in the target's vocabulary
        self.n_batch = n_batch
        # room for every slot's context plus its drafts; flash attention as the target decides it, for the
        # draft's cache types (a quantized -ctvd turns it on under auto, is refused under off)
        ctk, ctv = params.cache_type_k, params.cache_type_v
        flash = resolve_flash_attn(params.flash_attn, ctk, ctv, self.model.config.head_dim)
        self.kv = self.model.make_kv_cache(
            n_ctx + n_seq * (self.n_max + 1), n_seq, n_batch, False, ctk, ctv, flash
        )
        self.cached: list[list[int]] = [[] for _ in range(n_seq)]  # what each draft sequence holds
        self._scopes = [""] * n_seq  # whose tokens each draft sequence holds
        self._rng: dict[int, np.random.Generator] = {}
        self._saved = [-1] * n_seq  # tokens absorbed by each sequence's saved recurrent state (-1: none)

    # -- lifecycle ---------------------------------------------------------------------------------------

    def warmup(self) -> None:
        """Run the draft model's kernels once (a 4-token chunk and a single token), then forget them."""
        bos = self.tokenizer.bos_id if self.tokenizer.bos_id is not None else 0
        for n in (4, 1):
            try:
                self.model.forward(Batch.single([bos] * n, 0), self.kv)
            finally:
                self.kv.seq_rm(0)
        self.cached[0] = []

    def begin(self, seq: int, prompt: list[int], scope: str = "") -> None:
        self._rng.pop(seq, None)  # a new request reseeds its draft sampler
        if self._scopes[seq] != scope:  # another scope's cached prefix would catch up faster
            self.forget(seq)
            self._scopes[seq] = scope

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        pass

    def shift(self, seq: int, n_keep: int, n_discard: int, n_past: int) -> None:
        """The target shifted this sequence's context: shift the draft cache the same way."""
        c = self.cached[seq]
        if len(c) < n_past or self.kv.recurrent is not None:  # a recurrent state cannot be shifted
            self.forget(seq)
            return
        del c[n_past:]
        self.kv.seq_rm(seq, n_past)
        self.kv.seq_rm(seq, n_keep, n_keep + n_discard)
        self.kv.seq_add(seq, n_keep + n_discard, n_past, -n_discard, self.model.shift_k)
        del c[n_keep : n_keep + n_discard]

    def forget(self, seq: int) -> None:
        self.kv.seq_rm(seq)
        self.cached[seq] = []
        self._saved[seq] = -1

    def _rewind(self, seq: int, p: int) -> int:
        """Keep the first `p` cached tokens of `seq`, or fewer: a recurrent state goes back only to its
        saved state (or to nothing). Returns how many are kept."""
        c, rec = self.cached[seq], self.kv.recurrent
        if rec is not None:
            saved = self._saved[seq]
            if not 0 <= saved <= p:
                self.forget(seq)
                return 0
            self.kv.seq_rm(seq, saved)  # the attention cells after it; the state is restored next
            rec.restore(seq)
            p = saved
        else:
            self.kv.seq_rm(seq, p)
        del c[p:]
        return p

    # -- drafting ----------------------------------------------------------------------------------------

    def draft(self, jobs: list[DraftJob]) -> None:
        try:
            rows = self._catch_up(jobs)
            self._extend(jobs, rows)
        except KVCacheFullError:  # the draft cache ran out: start those sequences afresh, no drafts now
            for job in jobs:
                self.forget(job.seq)
                job.result, job.q = [], []
            return
        n_min = self.params.n_min
        for job in jobs:
            if len(job.result) < n_min:
                job.result, job.q = [], []

    def _catch_up(self, jobs: list[DraftJob]) -> list[np.ndarray]:
        """Evaluate what each sequence lacks (at least its last token): the last token's logits per job."""
        pending: list[tuple[int, list[int], int]] = []  # (seq, tokens to evaluate, first position)
        for job in jobs:
            ctx = [*job.tokens, job.last]
            c = self.cached[job.seq]
            p = min(_common_prefix(c, ctx), len(ctx) - 1)  # the last token is run again for its logits
            if p < len(c):
                p = self._rewind(job.seq, p)
            pending.append((job.seq, ctx[p:], p))
        rows: dict[int, np.ndarray] = {}
        while pending:
            pending = self._run_chunks(pending, rows)
        if self.kv.recurrent is not None:  # up to date: the state the next draft goes back to
            for job in jobs:
                self.kv.recurrent.snapshot(job.seq)
                self._saved[job.seq] = len(self.cached[job.seq])
        return [rows[job.seq] for job in jobs]

    def _run_chunks(
        self, pending: list[tuple[int, list[int], int]], rows: dict[int, np.ndarray]
    ) -> list[tuple[int, list[int], int]]:
        """One forward of up to n_batch pending tokens (several sequences); what is left afterwards."""
        toks: list[int] = []
        pos: list[int] = []
        seqs: list[int] = []
        outs: list[bool] = []
        ends: list[int] = []
        rest: list[tuple[int, list[int], int]] = []
        room = self.n_batch
        for seq, tokens, p0 in pending:
            n = min(len(tokens), room)
            if n == 0:
                rest.append((seq, tokens, p0))
                continue
            last = n == len(tokens)
            toks += tokens[:n]
            pos += range(p0, p0 + n)
            seqs += [seq] * n
            outs += [False] * (n - 1) + [last]
            if last:
                ends.append(seq)
            else:
                rest.append((seq, tokens[n:], p0 + n))
            self.cached[seq] += tokens[:n]
            room -= n
        logits, _ = self.model.forward(
            Batch(
                np.asarray(toks, np.int32),
                np.asarray(pos, np.int32),
                np.asarray(seqs, np.int32),
                np.asarray(outs),
            ),
            self.kv,
        )
        for i, seq in enumerate(ends):
            rows[seq] = logits[i].copy()
        return rest

    def _extend(self, jobs: list[DraftJob], rows: list[np.ndarray]) -> None:
        """Draft one position per forward for every job still drafting."""
        active = list(zip(jobs, rows, strict=True))
        limit = {job.seq: min(self.n_max, job.n_max) for job in jobs}
        while active:
            going: list[DraftJob] = []
            for job, row in active:
                if self._pick(job, row) and len(job.result) < limit[job.seq]:
                    going.append(job)
            if not going:
                return
            n = len(going)
            batch = Batch(
                np.asarray([j.result[-1] for j in going], np.int32),
                np.asarray([len(j.tokens) + len(j.result) for j in going], np.int32),
                np.asarray([j.seq for j in going], np.int32),
                np.ones(n, bool),
            )
            logits, _ = self.model.forward(batch, self.kv)
            for j in going:
                self.cached[j.seq].append(j.result[-1])
            active = [(j, logits[i]) for i, j in enumerate(going)]

    def _pick(self, job: DraftJob, row: np.ndarray) -> bool:
        """Add the next draft token from this row of draft logits; False when drafting stops."""
        row = row[: self.n_vocab]
        k = min(_TOP_K, len(row))
        ids = np.argpartition(row, -k)[-k:]
        ids = ids[np.argsort(-row[ids], kind="stable")]
        temp = job.temp if job.want_q else 1.0
        z = row[ids].astype(np.float64) / (temp if temp > 0 else 1.0)
        probs = np.exp(z - z[0])
        probs /= probs.sum()
        if probs[0] < self.params.p_min:
            return False
        if job.want_q:
            tok = int(ids[self._rng_of(job).choice(k, p=probs)])
            job.q.append((ids.astype(np.int32), probs.astype(np.float32)))
        else:
            tok = int(ids[0])
        job.result.append(tok)
        return True

    def _rng_of(self, job: DraftJob) -> np.random.Generator:
        rng = self._rng.get(job.seq)
        if rng is None:
            seed = None if job.seed == LLAMA_DEFAULT_SEED else (job.seed ^ _SEED_MIX)
            rng = self._rng[job.seq] = np.random.default_rng(seed)
        return rng
