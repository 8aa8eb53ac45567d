"""What every drafter sees: one job per drafting sequence, and the drafter protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

__all__ = ["DraftJob", "Drafter"]


@dataclass(slots=True, eq=False)
class DraftJob:
    """Propose up to `n_max` tokens to follow `tokens + [last]` of sequence `seq`.

    `q` is filled (one (ids, probs) candidate distribution per drafted token) only by drafters that
    sample, when the verifier asks for rejection sampling (`want_q`)."""

    seq: int
    tokens: list[int]  # the sequence the cache holds (the slot's own list: read, never modified)
    last: int  # the token just sampled, not yet in the cache
    n_max: int
    want_q: bool = False
    temp: float = 1.0
    seed: int = 0
    result: list[int] = field(default_factory=list)
    q: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)


class Drafter(Protocol):
    """One kind of drafter (llama.cpp's `common_speculative_impl`)."""

    n_max: int  # the longest draft it proposes

    def begin(self, seq: int, prompt: list[int], scope: str = "") -> None:
        """A new request of `scope` (`GenerationRequest.cache_scope`) starts on `seq` with this prompt: what
        a drafter learned from another scope's text must not draft for it (accepted drafts show in its
        timings)."""

    def draft(self, jobs: list[DraftJob]) -> None:
        """Fill `result` (and `q` when asked) of each job; an empty result: nothing to propose."""

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        """The target accepted `n_accepted` of the last draft of `seq` (`is_other`: another drafter's)."""
