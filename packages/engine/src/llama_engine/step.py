"""The step contract: what one forward pass runs, for each request, under one token budget.

vLLM v1's scheduler says "this step, request -> number of tokens"; here the requests are the KV cache's
sequences (generation slots 0..n_parallel-1, then the embedding sequence), so everything is a list
indexed by sequence id. The step is `Scheduler.schedule() -> model.forward(step.batch, kv) ->
Scheduler.postprocess(step, logits, hidden)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .batch import Batch

__all__ = ["Step", "StepBuilder", "drafts_that_fit"]

_NO_DRAFTS: list[int] = []


@dataclass(slots=True, eq=False)
class Step:
    """One step's plan. Sequence `q` runs `n_tokens[q]` consecutive batch tokens from `offset[q]` and
    gets `n_out[q]` output rows (logits and hidden states, in batch order) from `out_offset[q]`.

    A generating sequence runs its next token and then `drafts[q]`, proposed tokens to verify: every one
    of them has its logits. A prompt chunk outputs its last token's row only when it ends the prompt; an
    embedding chunk outputs the rows its pooling reads. The sum of `n_tokens` (`batch.n`) never exceeds
    the budget (`n_batch`). The lists belong to the scheduler and are refilled by every `schedule()`.
    """

    seqs: list[int]  # the scheduled sequences, in batch order
    n_tokens: list[int]  # [n_seq]: tokens each sequence runs this step (0: not scheduled)
    offset: list[int]  # [n_seq]: its first token's index in the batch
    n_out: list[int]  # [n_seq]: its output rows
    out_offset: list[int]  # [n_seq]: its first output row
    drafts: list[list[int]]  # [n_seq]: draft tokens after the decode token (empty: none)
    batch: Batch  # the tokens themselves: views of buffers allocated once

    @property
    def n_scheduled(self) -> int:
        """Tokens in this step (at most the budget)."""
        return self.batch.n

    def copy(self) -> Step:
        """A copy that outlives the next `schedule()` (a suspended step, resumed later)."""
        b = self.batch
        batch = Batch(b.tokens.copy(), b.pos.copy(), b.seq.copy(), b.output.copy(), b.n_logits)
        return Step(
            list(self.seqs),
            list(self.n_tokens),
            list(self.offset),
            list(self.n_out),
            list(self.out_offset),
            list(self.drafts),
            batch,
        )


class StepBuilder:
    """Fills a `Step` into buffers allocated once: no per-token Python objects, no dict per step."""

    def __init__(self, n_seq: int, n_batch: int, n_pos: int) -> None:
        self.n_batch = n_batch
        self._tokens = np.zeros(n_batch, np.int32)
        self._pos = np.zeros(n_batch, np.int32)
        self._seq = np.zeros(n_batch, np.int32)
        self._output = np.zeros(n_batch, bool)
        self._arange = np.arange(n_pos + n_batch, dtype=np.int32)  # positions are slices of this
        z = [0] * n_seq
        self.step = Step([], z[:], z[:], z[:], z[:], [_NO_DRAFTS] * n_seq, Batch.single([0]))
        self._n = 0
        self._n_out = 0
        self._n_logits = -1  # output rows with logits, once a chunk without them was placed
        self._reserved = 0
        self._limit = n_batch  # this step's budget (`cap` may lower it)

    @property
    def room(self) -> int:
        """Tokens still free under the budget."""
        return self._limit - self._n - self._reserved

    def cap(self, n: int) -> None:
        """At most n more tokens in this step (prompt and embedding chunks after the decode tokens)."""
        self._limit = min(self._limit, self._n + self._reserved + max(n, 0))

    def reserve(self, n: int) -> None:
        """Hold n tokens of the budget for a chunk placed later (`add_chunk(..., reserved=True)`)."""
        assert n <= self.room, "the scheduler overran its budget"
        self._reserved += n

    def begin(self) -> None:
        """Forget the previous step."""
        st = self.step
        for q in st.seqs:
            st.n_tokens[q] = st.n_out[q] = 0
            st.drafts[q] = _NO_DRAFTS
        st.seqs.clear()
        self._n = self._n_out = self._reserved = 0
        self._n_logits = -1
        self._limit = self.n_batch

    def add_decode(self, seq: int, token: int, drafts: list[int], pos: int) -> None:
        """A generating sequence's next token at `pos`, then its drafts; logits for all of them."""
        o, k = self._n, len(drafts)
        self._tokens[o] = token
        if k:
            self._tokens[o + 1 : o + 1 + k] = drafts
            self.step.drafts[seq] = drafts
        self._place(seq, pos, 1 + k, 0, 1 + k)

    def add_chunk(
        self,
        seq: int,
        tokens: np.ndarray,
        pos: int,
        out_lo: int,
        out_hi: int,
        logits: bool = True,
        reserved: bool = False,
    ) -> None:
        """Consecutive tokens of one sequence from `pos`; chunk tokens out_lo..out_hi-1 get output rows,
        with logits unless `logits` is False (embedding chunks: hidden states only; such chunks come last,
        so the rows with logits are the first `batch.n_logits`). `reserved`: its tokens were reserved."""
        o = self._n
        if reserved:
            self._reserved -= len(tokens)
        if not logits and self._n_logits < 0:
            self._n_logits = self._n_out
        assert logits is False or self._n_logits < 0, "rows with logits come before those without"
        self._tokens[o : o + len(tokens)] = tokens
        self._place(seq, pos, len(tokens), out_lo, out_hi)

    def _place(self, seq: int, pos: int, n: int, out_lo: int, out_hi: int) -> None:
        st, o = self.step, self._n
        assert n <= self.room, "the scheduler overran its budget"
        self._pos[o : o + n] = self._arange[pos : pos + n]
        self._seq[o : o + n] = seq
        self._output[o : o + n] = False
        self._output[o + out_lo : o + out_hi] = True
        st.seqs.append(seq)
        st.n_tokens[seq], st.offset[seq] = n, o
        st.n_out[seq], st.out_offset[seq] = out_hi - out_lo, self._n_out
        self._n += n
        self._n_out += out_hi - out_lo

    def finish(self) -> Step | None:
        """The step built since `begin()`, or None when nothing was scheduled."""
        if not self._n:
            return None
        n, b = self._n, self.step.batch
        b.tokens, b.pos, b.seq, b.output = self._tokens[:n], self._pos[:n], self._seq[:n], self._output[:n]
        b.n_logits = self._n_logits
        return self.step


def drafts_that_fit(drafts: Sequence[int], room: int) -> list[int]:
    """The drafts a sequence can verify with `room` tokens left after its decode token."""
    if not drafts or room <= 0:
        return _NO_DRAFTS
    return list(drafts) if len(drafts) <= room else list(drafts[:room])
