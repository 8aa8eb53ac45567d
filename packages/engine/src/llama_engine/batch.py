"""A batch: tokens from many sequences, processed in one forward pass (llama_batch's counterpart)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Batch"]


@dataclass(slots=True)
class Batch:
    """n tokens; token t belongs to sequence seq[t] at position pos[t]; output[t] asks for its output row
    (final hidden state and logits).

    Tokens of one sequence appear in increasing position order. Prompt chunks and single decode tokens of
    different sequences mix freely. Only the first `n_logits` output rows get logits (-1: all of them):
    embedding rows, placed last, need the hidden states alone.
    """

    tokens: np.ndarray  # int32 [n]
    pos: np.ndarray  # int32 [n]
    seq: np.ndarray  # int32 [n]
    output: np.ndarray  # bool [n]
    n_logits: int = -1

    @property
    def n(self) -> int:
        return len(self.tokens)

    @classmethod
    def single(cls, tokens: list[int], seq: int = 0, start: int = 0, all_logits: bool = False) -> Batch:
        """One sequence's tokens at positions start, start+1, ...; logits for the last (or all)."""
        n = len(tokens)
        out = np.ones(n, bool) if all_logits else np.arange(n) == n - 1
        return cls(
            np.asarray(tokens, np.int32),
            np.arange(start, start + n, dtype=np.int32),
            np.full(n, seq, np.int32),
            out,
        )

    @classmethod
    def concat(cls, parts: list[Batch]) -> Batch:
        return cls(
            np.concatenate([p.tokens for p in parts]),
            np.concatenate([p.pos for p in parts]),
            np.concatenate([p.seq for p in parts]),
            np.concatenate([p.output for p in parts]),
        )
