"""Adaptive draft length per slot: failing drafts cost little, accepted drafts keep their full length.

llama.cpp drafts `n_max` tokens every step whatever happened to the last drafts, so a drafter that is
wrong (a draft model on unpredictable text, synthetic rate 0) costs its draft forwards and a wider
verification on every step. Here each slot keeps a draft limit and a back-off:

- a draft the target rejects at position i shrinks the limit to max(floor, i + 1, limit // 2): the
  drafter was right i times, give it one more; never less than half at once;
- a draft rejected at once when the limit is already at the floor starts a back-off: no drafts for the
  next `wait` steps, and `wait` doubles (1, 2, 4, ... up to `WAIT_MAX`) while such drafts keep failing;
- any accepted draft token ends the back-off (`wait` back to 1), and a fully accepted draft doubles the
  limit again (up to the drafters' longest draft).

So an all-rejected stream drafts a few times and then probes about once every `WAIT_MAX` steps, while
text the drafter predicts keeps full-length drafts. Greedy output is unchanged: the policy only decides
how much is drafted, never what the target accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WAIT_MAX", "Backoff"]

WAIT_MAX = 32  # the longest back-off in steps: a probe costs ~1/33 of a draft forward per step


@dataclass(slots=True)
class Backoff:
    """One slot's draft limit and back-off (reset for each request)."""

    full: int  # the longest draft of any drafter
    floor: int = 1  # the shortest draft worth proposing (the draft model's n_min)
    limit: int = 0  # the current draft limit (0: full)
    skip: int = 0  # steps left without drafting
    wait: int = 1  # the next back-off length
    n_skipped: int = 0  # steps skipped so far (for tests and reports)

    def __post_init__(self) -> None:
        self.floor = max(1, min(self.floor, self.full))
        self.limit = self.limit or self.full

    def allow(self) -> int:
        """The draft limit for this step, or 0 while backing off (which consumes one step)."""
        if self.skip > 0:
            self.skip -= 1
            self.n_skipped += 1
            return 0
        return self.limit

    def update(self, n_drafted: int, n_accepted: int) -> None:
        """The target verified `n_drafted` drafts of this slot and kept `n_accepted`."""
        if n_drafted <= 0:
            return
        if n_accepted >= n_drafted:
            self.wait = 1
            self.limit = min(self.full, 2 * max(self.limit, n_drafted))
            return
        if n_accepted > 0:
            self.wait = 1
        elif self.limit <= self.floor:  # even the shortest draft failed: stop drafting for a while
            self.skip = self.wait
            self.wait = min(WAIT_MAX, 2 * self.wait)
        self.limit = max(self.floor, n_accepted + 1, self.limit // 2)
