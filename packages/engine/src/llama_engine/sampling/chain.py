"""The sampler chain of one sequence, built from SamplingParams as llama.cpp's common_sampler.

common/sampling.cpp ``common_sampler_init``: logit biases first (the request's, then -inf for
end-of-generation tokens when ``ignore_eos``, then the model's suppressed tokens); then, without
mirostat, one sampler per entry of ``samplers`` followed by the seeded ``dist``; with mirostat,
only ``temp`` and the mirostat sampler. Disabled samplers are left out, as llama.cpp builds them
"empty".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

from ..grammar.elements import GrammarStopError
from ..grammar.matcher import GrammarMatcher
from . import samplers as s
from .dry import DryVocab
from .params import SamplingParams
from .reasoning_budget import BudgetState, ReasoningBudget
from .sorting import top_positions

__all__ = ["Sampler", "TokenProbs", "warmup"]


class TokenProbs(NamedTuple):
    """A sampled token, its probability and the top candidates ``[(token, prob), ...]``, best first."""

    token: int
    prob: float
    top: list[tuple[int, float]]


class Sampler:
    """Sampling state of one sequence: ``sample(logits)``, then ``accept(token)``.

    ``vocab`` is needed only when DRY is enabled; ``eog_tokens`` are banned when ``ignore_eos``;
    ``suppress_tokens`` (GGUF ``tokenizer.ggml.suppress_tokens``) are always banned; ``n_ctx``
    resolves ``repeat_last_n`` / ``dry_penalty_last_n`` = -1. Like the llama.cpp server, feed the
    prompt through ``accept_many`` before the first ``sample``. Not thread-safe.

    ``grammar`` constrains the output as common_sampler_sample: the chain samples, the token is
    checked against the grammar, and only when the grammar rejects it are the logits masked by the
    grammar and the chain run again. ``accept`` advances the grammar too (not ``accept_many``: the
    prompt is not part of the grammar's text).
    """

    def __init__(
        self,
        params: SamplingParams,
        n_vocab: int,
        *,
        vocab: DryVocab | None = None,
        eog_tokens: Sequence[int] = (),
        suppress_tokens: Sequence[int] = (),
        n_ctx: int = 0,
        grammar: GrammarMatcher | None = None,
        complete: Callable[[int], bool] | None = None,
    ) -> None:
        params.validate()
        if n_vocab <= 0:
            raise ValueError(f"n_vocab must be positive, got {n_vocab}")
        self.params = params
        self.n_vocab = n_vocab
        self._arange = np.arange(n_vocab, dtype=np.int32)
        self._cand = s.Candidates(n_vocab)
        self._chain = _build_chain(params, n_vocab, vocab, eog_tokens, suppress_tokens, n_ctx)
        self._stateful = [x for x in self._chain if type(x).accept is not s._Sampler.accept]
        self._one = np.empty(1, dtype=np.int32)
        self.grammar = grammar
        self._usable = _not_banned(params, n_vocab, eog_tokens, suppress_tokens) if grammar else None
        rb = params.reasoning_budget
        # `complete(token)`: the token's piece ends on a whole UTF-8 character (the budget never cuts one)
        self.budget = ReasoningBudget(rb, complete or _always) if rb is not None else None

    @property
    def seed(self) -> int:
        """The seed in use by the final (token-choosing) sampler; random when params.seed is the default."""
        last = self._chain[-1]
        assert isinstance(last, s._Seeded)
        return last.seed_cur

    def sample(self, logits: np.ndarray) -> int:
        """Run the chain on one row of logits (float32[n_vocab]) and return the chosen token id.

        With a grammar, raises GrammarStopError when the grammar leaves no token to choose."""
        if logits.shape != (self.n_vocab,):
            raise ValueError(f"logits must have shape ({self.n_vocab},), got {logits.shape}")
        if self.budget is not None:
            self.budget.poll()  # a control request asked to end the thinking block
        token = self._run(logits, None)
        g = self._applied_grammar()
        if g is None or g.allows(token):
            return token
        allowed = g.allowed()
        assert allowed is not None and self._usable is not None  # allows() is True while awaiting
        if not np.any(allowed & self._usable):
            raise GrammarStopError(g.can_end)
        return self._run(logits, allowed)

    def _run(self, logits: np.ndarray, allowed: np.ndarray | None) -> int:
        c = self._cand
        np.copyto(c.ids, self._arange)
        np.copyto(c.logits, logits, casting="same_kind")
        if self.budget is not None:  # applied first, as common_sampler_sample
            self.budget.mask(c.logits)
        if allowed is not None:  # llama_grammar_apply_impl: rejected candidates get -inf
            np.copyto(c.logits, np.float32(-np.inf), where=~allowed)
        c.n, c.is_sorted, c.selected, c.identity = self.n_vocab, False, -1, True
        for smpl in self._chain:
            smpl.apply(c)
            c.identity = c.identity and smpl.keeps_order
        if not 0 <= c.selected < c.n:
            raise RuntimeError("no token selected during sampling: check the sampling configuration")
        return int(c.ids[c.selected])

    def sample_with_probs(self, logits: np.ndarray, n_probs: int, post_sampling: bool = False) -> TokenProbs:
        """``sample`` plus probabilities as the llama.cpp server reports them for ``n_probs``.

        Default: softmax of the raw logits over the whole vocabulary (the chain ignored), the
        ``n_probs`` most likely tokens. ``post_sampling``: the candidates left by the chain, by
        probability, at most ``n_probs``, zero probabilities dropped.
        """
        token = self.sample(logits)
        if post_sampling:
            ids, probs = self.candidates()
            where = np.flatnonzero(ids == token)
            prob = float(probs[where[0]]) if where.size else 1.0
            m = min(n_probs, ids.shape[0])
            nz = np.flatnonzero(probs[:m] == 0)
            m = int(nz[0]) if nz.size else m
            return TokenProbs(token, prob, list(zip(ids[:m].tolist(), probs[:m].tolist(), strict=True)))
        n_top = min(n_probs, self.n_vocab)
        top_ids, top_p, prob = _presample(np.ascontiguousarray(logits, dtype=np.float32), n_top, token)
        return TokenProbs(token, float(prob), list(zip(top_ids.tolist(), top_p.tolist(), strict=True)))

    def candidates(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, probs) left by the last ``sample``, most probable first (common_sampler_get_candidates)."""
        c = self._cand
        ids, probs = c.ids[: c.n], c.probs[: c.n]
        if c.is_sorted:
            return ids.copy(), probs.copy()
        order = np.argsort(-probs, kind="stable")
        return ids[order], probs[order]

    def accept(self, token: int) -> None:
        """Record a token emitted for this sequence (the grammar, repetition penalties and DRY history).

        Raises GrammarError when the grammar cannot take the token."""
        g = self._applied_grammar()  # decided before the budget sees the token (common_sampler_accept)
        b = self.budget
        if b is not None:
            b.accept(token)
            if g is None and self.grammar is not None and b.state == BudgetState.DONE:
                for t in b.end_match:  # the closing tag may hold the lazy grammar's trigger: replay it
                    self.grammar.accept(t)
        if g is not None:
            g.accept(token)
        self._one[0] = token
        for smpl in self._stateful:
            smpl.accept(self._one)

    def _applied_grammar(self) -> GrammarMatcher | None:
        """The grammar, unless it is lazy and the reasoning budget is inside the thinking block
        (llama.cpp's grammar_should_apply: a tool-call trigger never fires inside the thinking)."""
        g = self.grammar
        if g is not None and g.lazy and self.budget is not None and self.budget.paused_grammar:
            return None
        return g

    def accept_many(self, tokens: Iterable[int] | np.ndarray) -> None:
        """``accept`` each token in order (the prompt, when a request starts)."""
        if isinstance(tokens, np.ndarray):
            arr = np.ascontiguousarray(tokens, dtype=np.int32)
        else:
            arr = np.fromiter(tokens, dtype=np.int32)
        for smpl in self._stateful:
            smpl.accept(arr)

    def reset(self) -> None:
        """Forget the history and reseed (a new random seed when params.seed is the default)."""
        for smpl in self._chain:
            smpl.reset()
        if self.grammar is not None:
            self.grammar.reset()


def _always(token: int) -> bool:
    return True


def _build_chain(
    p: SamplingParams,
    n_vocab: int,
    vocab: DryVocab | None,
    eog_tokens: Sequence[int],
    suppress_tokens: Sequence[int],
    n_ctx: int,
) -> list[s._Sampler]:
    seed = p.seed & 0xFFFFFFFF
    f32 = np.float32
    chain: list[s._Sampler] = []
    bias = list(p.logit_bias)
    if p.ignore_eos:
        bias += [(t, -math.inf) for t in eog_tokens]
    bias += [(t, -math.inf) for t in suppress_tokens]
    for t, _ in bias:
        if not 0 <= t < n_vocab:
            raise ValueError(f"logit_bias: token {t} is outside the vocabulary (n_vocab = {n_vocab})")
    if bias:
        chain.append(s.LogitBias([t for t, _ in bias], [b for _, b in bias]))

    if p.mirostat:
        if f32(p.temperature) != f32(1.0):
            chain.append(s.Temp(p.temperature))
        if p.mirostat == 1:
            chain.append(s.Mirostat(n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100))
        else:
            chain.append(s.MirostatV2(seed, p.mirostat_tau, p.mirostat_eta))
        return chain

    for name in p.samplers:
        smpl = _make(name, p, n_vocab, vocab, n_ctx, seed)
        if smpl is not None:
            chain.append(smpl)
    chain.append(s.Dist(seed))
    return chain


def _not_banned(
    p: SamplingParams, n_vocab: int, eog_tokens: Sequence[int], suppress_tokens: Sequence[int]
) -> np.ndarray:
    """Tokens the chain's logit biases leave choosable (a -inf bias bans; so do ignore_eos and the
    model's suppressed tokens): a grammar that allows none of them has nothing left to give."""
    usable = np.ones(n_vocab, dtype=bool)
    banned = [t for t, b in p.logit_bias if b == -math.inf] + list(suppress_tokens)
    if p.ignore_eos:
        banned += list(eog_tokens)
    banned = [t for t in banned if 0 <= t < n_vocab]
    usable[banned] = False
    return usable


def _last_n(name: str, value: int, n_ctx: int) -> int:
    if value != -1:
        return value
    if n_ctx <= 0:
        raise ValueError(f"{name} = -1 (the context size) needs n_ctx")
    return n_ctx


def _make(
    name: str, p: SamplingParams, n_vocab: int, vocab: DryVocab | None, n_ctx: int, seed: int
) -> s._Sampler | None:
    """One sampler of the chain, or None where llama.cpp would build an empty one."""
    f32 = np.float32
    if name == "penalties":
        last_n = max(_last_n("repeat_last_n", p.repeat_last_n, n_ctx), 0)
        off = f32(p.repeat_penalty) == 1 and f32(p.frequency_penalty) == 0 and f32(p.presence_penalty) == 0
        if last_n == 0 or off:
            return None
        return s.Penalties(n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty)
    if name == "dry":
        last_n = max(_last_n("dry_penalty_last_n", p.dry_penalty_last_n, n_ctx), 0)
        if f32(p.dry_multiplier) == 0 or f32(p.dry_base) < 1 or last_n == 0:
            return None
        if vocab is None:
            raise ValueError("DRY (dry_multiplier != 0) needs the vocabulary: pass vocab=DryVocab(...)")
        if vocab.n_vocab != n_vocab:
            raise ValueError(f"DRY vocabulary has {vocab.n_vocab} tokens, expected {n_vocab}")
        breakers = vocab.breakers(p.dry_sequence_breakers)
        return s.Dry(breakers, p.dry_multiplier, p.dry_base, p.dry_allowed_length, last_n)
    if name == "top_n_sigma":
        return s.TopNSigma(p.top_n_sigma) if f32(p.top_n_sigma) > 0 else None
    if name == "top_k":
        return s.TopK(p.top_k) if p.top_k > 0 else None
    if name == "typ_p":
        return s.Typical(p.typical_p, p.min_keep) if f32(p.typical_p) < 1 else None
    if name == "top_p":
        return s.TopP(p.top_p, p.min_keep) if f32(p.top_p) < 1 else None
    if name == "min_p":
        return s.MinP(p.min_p, p.min_keep) if f32(p.min_p) > 0 else None
    if name == "xtc":
        if f32(p.xtc_probability) <= 0 or f32(p.xtc_threshold) > f32(0.5):
            return None
        return s.Xtc(p.xtc_probability, p.xtc_threshold, p.min_keep, seed)
    if name == "temperature":
        if f32(p.temperature) == 1 and f32(p.dynatemp_range) <= 0:
            return None
        return s.TempExt(p.temperature, p.dynatemp_range, p.dynatemp_exponent)
    raise ValueError(f"unknown sampler {name!r}")


@njit(cache=True, nogil=True)
def _presample(logits, n_top, token):
    """Server ``get_token_probabilities``: softmax of raw logits, the n_top best, and token's prob."""
    n = logits.shape[0]
    top = top_positions(logits, n, max(n_top, 1))
    max_l = logits[top[0]]
    cum_sum = np.float32(0.0)
    for i in range(n):
        cum_sum += np.float32(math.exp(logits[i] - max_l))
    top_ids = top[:n_top].astype(np.int32)
    top_p = np.empty(n_top, dtype=np.float32)
    for j in range(n_top):
        top_p[j] = np.float32(math.exp(logits[top[j]] - max_l)) / cum_sum
    prob = np.float32(math.exp(logits[token] - max_l)) / cum_sum
    return top_ids, top_p, prob


def warmup() -> None:
    """Compile (or load from numba's cache) every sampling kernel, on a tiny vocabulary."""
    n = 64
    pieces = [bytes([65 + i % 26]) for i in range(n - 2)] + [b"\n", b"x:"]
    vocab = DryVocab(pieces, lambda text: [pieces.index(bytes([c])) for c in text if bytes([c]) in pieces])
    x = np.linspace(-3.0, 3.0, n, dtype=np.float32)[::-1].copy()
    for p in (
        SamplingParams(seed=1),
        SamplingParams(seed=1, top_k=0, top_p=0.5, min_p=0.0, repeat_penalty=1.1, dry_multiplier=0.8),
        SamplingParams(
            seed=1,
            samplers=("min_p", "top_n_sigma", "typ_p", "xtc", "temperature"),
            top_n_sigma=2.0,
            typical_p=0.9,
            xtc_probability=1.0,
            min_p=0.01,
            dynatemp_range=0.5,
            logit_bias=((0, 1.0),),
        ),
        SamplingParams(
            seed=1,
            samplers=("top_k", "penalties", "dry"),
            repeat_penalty=1.2,
            dry_multiplier=1.0,
            temperature=0.0,
        ),
        SamplingParams(seed=1, mirostat=1, temperature=0.5),
        SamplingParams(seed=1, mirostat=2),
    ):
        smpl = Sampler(p, n, vocab=vocab)
        smpl.accept_many([1, 2, 3, 1, 2, 3, 1, 2])
        for _ in range(2):
            smpl.accept(smpl.sample_with_probs(x, 3).token)
            smpl.sample_with_probs(x, 3, post_sampling=True)
