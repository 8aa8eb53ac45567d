"""The reasoning budget: a token budget for the thinking block (llama.cpp's common/reasoning-budget).

Once the start tag's tokens appear (in the prefill, i.e. the generation prompt, or in the output), every
generated token counts against the budget; when it runs out (and the last token completed its UTF-8
character) the forced sequence (an optional message, then the first end tag) is imposed one token per
step: every other candidate's logit becomes -inf before the chain runs. An end tag produced naturally ends
the count. A later start tag starts a new count. Budget 0 forces the end as soon as the block opens.
`UNLIMITED` is the budget of a sampler that only tracks the block: for a control request that ends the
thinking on demand (`request_end`), or a lazy grammar paused inside the block (llama.cpp's INT_MAX).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np

__all__ = [
    "UNLIMITED",
    "BudgetState",
    "ReasoningBudget",
    "ReasoningBudgetParams",
    "piece_complete",
    "utf8_complete",
]

UNLIMITED = 2**31 - 1  # INT_MAX: the block is tracked, never cut by the count


class ReasoningBudgetParams(msgspec.Struct, frozen=True, gc=False):
    """What the budget needs, as token ids (the server tokenizes the template's thinking tags)."""

    tokens: int  # the budget (>= 0)
    start: tuple[int, ...]  # the start tag
    ends: tuple[tuple[int, ...], ...]  # end tags; the first one is forced
    forced: tuple[int, ...]  # message + first end tag: what is imposed when the budget runs out
    prefill: tuple[int, ...] = ()  # the generation prompt, fed before the first token

    def validate(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 0:
            raise ValueError(f"reasoning budget must be a non-negative integer, got {self.tokens!r}")
        if not self.start or not self.ends or not all(self.ends) or not self.forced:
            raise ValueError("reasoning budget needs start, end and forced token sequences")


class BudgetState(enum.IntEnum):
    IDLE = 0  # waiting for the start tag
    COUNTING = 1
    FORCING = 2  # imposing the forced sequence
    WAITING_UTF8 = 3  # out of budget, the last token ended inside a character
    DONE = 4


class _Matcher:
    """Finds any of several token sequences ending at the current token (a streaming match: the
    candidate prefixes are kept, so overlapping starts are not missed)."""

    def __init__(self, seqs: Sequence[tuple[int, ...]]) -> None:
        self.seqs = list(dict.fromkeys(s for s in seqs if s))
        self._open: list[tuple[int, int]] = []  # (sequence index, tokens matched so far)

    def advance(self, token: int) -> int:
        """The index of the sequence this token completes, or -1."""
        nxt = [(i, n + 1) for i, n in self._open if self.seqs[i][n] == token]
        nxt += [(i, 1) for i, s in enumerate(self.seqs) if s[0] == token]
        for i, n in nxt:
            if n == len(self.seqs[i]):
                self._open = []
                return i
        self._open = nxt
        return -1

    def reset(self) -> None:
        self._open = []


class ReasoningBudget:
    """One sequence's budget state; `accept` every generated token, `mask` the logits before the chain."""

    def __init__(self, p: ReasoningBudgetParams, complete: Callable[[int], bool]) -> None:
        self.p = p
        self._complete = complete  # does this token's piece end on a complete UTF-8 character
        self._start = _Matcher([p.start])
        self._end = _Matcher(p.ends)
        self.state = BudgetState.IDLE
        self.remaining = p.tokens
        self._pos = 0
        self.end_match: tuple[int, ...] = ()  # the end sequence that closed the block (to replay)
        self._end_requested = False  # set from another thread (`request_end`), acted on by `poll`
        for t in p.prefill:
            self.accept(t)

    @property
    def forced(self) -> int:
        """The token this step must produce, or -1."""
        if self.state == BudgetState.FORCING and self._pos < len(self.p.forced):
            return self.p.forced[self._pos]
        return -1

    def mask(self, logits: np.ndarray) -> None:
        """While forcing: every candidate but the forced token gets -inf (in place)."""
        t = self.forced
        if t >= 0:
            keep = logits[t]
            logits.fill(np.float32(-np.inf))
            logits[t] = keep

    def force(self) -> bool:
        """End the thinking now (a control request): only while counting."""
        if self.state != BudgetState.COUNTING:
            return False
        self._begin_forcing()
        return True

    def request_end(self) -> None:
        """Ask for `force` before the next token is sampled (safe from any thread: one flag is set)."""
        self._end_requested = True

    def poll(self) -> None:
        """Act on a pending `request_end` (the sequence's own thread, before sampling)."""
        if self._end_requested:
            self._end_requested = False
            self.force()

    @property
    def paused_grammar(self) -> bool:
        """Inside the block (counting, waiting or forcing): a lazy grammar is neither applied nor fed."""
        return self.state not in (BudgetState.IDLE, BudgetState.DONE)

    def accept(self, token: int) -> None:
        st = self.state
        if st in (BudgetState.IDLE, BudgetState.DONE):
            if self._start.advance(token) >= 0:
                self._end.reset()
                self.end_match = ()
                self._begin_counting()
        elif st == BudgetState.FORCING:
            match = self._end.advance(token)
            self._pos += 1
            if self._pos >= len(self.p.forced):
                self._done(match)
        elif (match := self._end.advance(token)) >= 0:  # counting or waiting: the block ended by itself
            self._done(match)
        elif st == BudgetState.WAITING_UTF8:
            if self._complete(token):
                self._begin_forcing()
        else:
            self.remaining -= 1
            if self.remaining <= 0:
                if self._complete(token):
                    self._begin_forcing()
                else:
                    self.state = BudgetState.WAITING_UTF8
                    self._end.reset()

    def _done(self, match: int) -> None:
        self.state = BudgetState.DONE
        self.end_match = self._end.seqs[match] if match >= 0 else ()

    def _begin_counting(self) -> None:
        self.state, self.remaining = BudgetState.COUNTING, self.p.tokens
        if self.remaining <= 0:
            self._begin_forcing()

    def _begin_forcing(self) -> None:
        self.state, self._pos = BudgetState.FORCING, 0
        self._end.reset()


def utf8_complete(piece: bytes) -> bool:
    """The piece ends on a whole UTF-8 character (common_utf8_is_complete)."""
    for back in range(1, min(4, len(piece)) + 1):
        c = piece[-back]
        if c & 0xC0 != 0x80:  # the last character's lead byte: does it have all its continuation bytes
            need = (
                1
                if c < 0x80
                else 2
                if c >> 5 == 0b110
                else 3
                if c >> 4 == 0b1110
                else 4
                if c >> 3 == 0b11110
                else 1
            )
            return back >= need
    return not piece


def piece_complete(tokenizer: Any) -> Callable[[int], bool]:
    """`complete(token)` for a tokenizer: the token's piece ends on a whole UTF-8 character."""
    return lambda token: utf8_complete(tokenizer.token_to_piece(token))
