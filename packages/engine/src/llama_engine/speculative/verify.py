"""Choosing the token at each verified position when the target does not simply sample and match.

Plain verification (the scheduler's default) samples every row with the request's sampler and keeps a
draft while it equals the sampled token: the output is exactly plain decoding's. Two others:

- rejection sampling (`--spec-draft-sampling probabilistic`, temperature > 0): draft token x drawn from
  the draft's q is kept with probability min(1, p(x)/q(x)); otherwise the token comes from the residual
  max(p - q, 0), renormalized. The output distribution is the target's p (Leviathan et al., 2023);
- synthetic acceptance (`--spec-synth-*`, for benchmarking): a draft is kept with a fixed conditional
  probability per position whatever the target says (never an end-of-generation token); otherwise the
  target's sampled token ends the step.

Each chooser samples the row (advancing the sampler's own random stream, as llama.cpp does) but leaves
`accept` to the scheduler, which emits the token.
"""

from __future__ import annotations

import numpy as np

from ..sampling import Sampler
from ..sampling.rng import canonical_double, canonical_float, mt_new

__all__ = ["RejectionVerifier", "SyntheticVerifier"]


class RejectionVerifier:
    """Rejection sampling against the draft's candidate distributions; its own seeded uniform stream."""

    def __init__(self, seed: int) -> None:
        self._rng = mt_new(seed & 0xFFFFFFFF)

    def _uniform(self) -> float:
        return float(canonical_float(self._rng))

    def choose(
        self, sampler: Sampler, row: np.ndarray, draft: int, q: tuple[np.ndarray, np.ndarray]
    ) -> tuple[int, bool]:
        """(token, whether it is the draft) for one drafted position."""
        target = sampler.sample(row)  # leaves the target distribution in the sampler's candidates
        ids, probs = sampler.candidates()
        q_ids, q_probs = q
        p_x = float(probs[ids == draft].sum())
        q_x = float(q_probs[q_ids == draft].sum())
        if q_x > 0.0 and (p_x >= q_x or self._uniform() < p_x / q_x):
            return draft, True
        q_on = np.zeros(len(ids), np.float32)  # q over the target's candidates (0 outside q's support)
        order = np.argsort(ids, kind="stable")
        at = np.searchsorted(ids[order], q_ids)
        ok = at < len(ids)
        ok[ok] = ids[order][at[ok]] == q_ids[ok]
        q_on[order[at[ok]]] = q_probs[ok]
        residual = np.maximum(probs.astype(np.float32) - q_on, 0.0)
        total = float(residual.sum())
        if total <= 0.0:
            return target, target == draft
        u = self._uniform() * total
        hit = int(np.searchsorted(np.cumsum(residual, dtype=np.float64), u, side="left"))
        return int(ids[min(hit, len(ids) - 1)]), False


class SyntheticVerifier:
    """Fixed acceptance probabilities per draft position (`probs[i]`: given the drafts before it kept)."""

    def __init__(self, probs: tuple[float, ...], seed: int, eog: frozenset[int]) -> None:
        self.probs = probs
        self.eog = eog
        self._rng = mt_new(seed & 0xFFFFFFFF)

    def choose(self, sampler: Sampler, row: np.ndarray, draft: int, i: int) -> tuple[int, bool]:
        target = sampler.sample(row)
        keep = float(canonical_double(self._rng)) < self.probs[i]
        if keep and draft not in self.eog:  # a drafted end-of-generation token would end the output early
            return draft, True
        return target, False
