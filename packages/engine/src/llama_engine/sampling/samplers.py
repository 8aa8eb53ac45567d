"""The samplers of the chain: state (history rings, RNGs, mirostat's mu) around the kernels.

Each class is one llama.cpp ``llama_sampler``: ``apply(cand)`` edits the candidate array,
``accept(tokens)`` records emitted (or prompt) tokens, ``reset()`` forgets them and reseeds.
A sampler llama.cpp would build as "empty" (disabled by its parameters) is never built here.
"""

from __future__ import annotations

import numpy as np

from . import kernels as k
from .dry import DryBreakers, dry_apply
from .rng import mt_new, mt_seed, resolve_seed

__all__ = [
    "Candidates",
    "Dist",
    "Dry",
    "LogitBias",
    "MinP",
    "Mirostat",
    "MirostatV2",
    "Penalties",
    "Temp",
    "TempExt",
    "TopK",
    "TopNSigma",
    "TopP",
    "Typical",
    "Xtc",
]

_MAX_RING = 1 << 20  # history rings longer than this are cut (more tokens than any context)


class Candidates:
    """``llama_token_data_array``: buffers of n_vocab entries, the first ``n`` live."""

    __slots__ = ("identity", "ids", "is_sorted", "logits", "n", "probs", "selected")

    def __init__(self, n_vocab: int) -> None:
        self.ids = np.empty(n_vocab, dtype=np.int32)
        self.logits = np.empty(n_vocab, dtype=np.float32)
        self.probs = np.zeros(n_vocab, dtype=np.float32)
        self.n = 0
        self.is_sorted = False
        self.selected = -1
        self.identity = False  # ids[i] == i for the whole vocabulary: lets samplers index by id


class _Sampler:
    # False when apply may reorder or drop candidates (Candidates.identity no longer holds)
    keeps_order = True

    def apply(self, c: Candidates) -> None:
        raise NotImplementedError

    def accept(self, tokens: np.ndarray) -> None:
        return None

    def reset(self) -> None:
        return None


class _Seeded(_Sampler):
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.seed_cur = resolve_seed(seed)
        self.state = mt_new(self.seed_cur)

    def reset(self) -> None:
        self.seed_cur = resolve_seed(self.seed)
        mt_seed(self.state, self.seed_cur)


class LogitBias(_Sampler):
    """llama_sampler_logit_bias: add (token, bias) pairs, -inf bans."""

    def __init__(self, tokens: list[int], biases: list[float]) -> None:
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.biases = np.asarray(biases, dtype=np.float32)

    def apply(self, c: Candidates) -> None:
        k.logit_bias(c.ids, c.logits, c.n, self.tokens, self.biases)


class Penalties(_Sampler):
    """llama_sampler_penalties: repeat / frequency / presence over the last ``last_n`` tokens."""

    def __init__(self, n_vocab: int, last_n: int, repeat: float, freq: float, present: float) -> None:
        self.ring = np.zeros(min(last_n, _MAX_RING), dtype=np.int32)
        self.meta = np.zeros(3, dtype=np.int64)
        self.counts = np.zeros(n_vocab, dtype=np.int32)
        self.mark = np.zeros(n_vocab, dtype=np.uint8)
        self.repeat, self.freq, self.present = np.float32(repeat), np.float32(freq), np.float32(present)

    def apply(self, c: Candidates) -> None:
        k.penalties(
            c.ids, c.logits, c.n, self.counts, self.ring, self.meta, self.mark, c.identity, self.repeat,
            self.freq, self.present,
        )  # fmt: skip
        c.is_sorted = False

    def accept(self, tokens: np.ndarray) -> None:
        k.penalties_accept(self.ring, self.meta, self.counts, tokens)

    def reset(self) -> None:
        self.meta[:] = 0
        self.counts[:] = 0


class Dry(_Sampler):
    """llama_sampler_dry: penalise tokens that extend a repeated sequence."""

    def __init__(
        self, breakers: DryBreakers, multiplier: float, base: float, allowed_length: int, last_n: int
    ) -> None:
        self.b = breakers
        cap = min(last_n, _MAX_RING)
        self.ring = np.zeros(cap, dtype=np.int32)
        self.meta = np.zeros(3, dtype=np.int64)
        self.repeat_count = np.zeros(cap, dtype=np.int32)
        self.max_rep = np.full(breakers.head_start.shape[0], -1, dtype=np.int32)
        self.multiplier, self.base = np.float32(multiplier), np.float32(base)
        self.allowed_length, self.last_n = allowed_length, cap

    def apply(self, c: Candidates) -> None:
        b = self.b
        dry_apply(
            c.ids, c.logits, c.n, self.ring, self.meta, b.head_start, b.head_len, b.tail_off, b.tail_tok,
            b.single, self.multiplier, self.base, self.allowed_length, self.last_n, self.repeat_count,
            self.max_rep, c.identity,
        )  # fmt: skip
        c.is_sorted = False

    def accept(self, tokens: np.ndarray) -> None:
        k.ring_push_many(self.ring, self.meta, tokens)

    def reset(self) -> None:
        self.meta[:] = 0


class TopNSigma(_Sampler):
    """llama_sampler_top_n_sigma: keep logits within n standard deviations of the best."""

    def __init__(self, n: float) -> None:
        self.nsig = np.float32(n)

    def apply(self, c: Candidates) -> None:
        k.top_n_sigma(c.logits, c.n, self.nsig)


class TopK(_Sampler):
    """llama_sampler_top_k: keep the k best, sorted."""

    keeps_order = False

    def __init__(self, top_k: int) -> None:
        self.k = top_k

    def apply(self, c: Candidates) -> None:
        c.n = k.top_k(c.ids, c.logits, c.probs, c.n, c.is_sorted, self.k)
        c.is_sorted = True


class Typical(_Sampler):
    """llama_sampler_typical: locally typical sampling."""

    keeps_order = False

    def __init__(self, p: float, min_keep: int) -> None:
        self.p, self.min_keep = np.float32(p), min_keep

    def apply(self, c: Candidates) -> None:
        c.n = k.typical(c.ids, c.logits, c.probs, c.n, c.is_sorted, self.p, self.min_keep)
        c.is_sorted = False


class TopP(_Sampler):
    """llama_sampler_top_p: smallest set of best tokens with probability >= p."""

    keeps_order = False

    def __init__(self, p: float, min_keep: int) -> None:
        self.p, self.min_keep = np.float32(p), min_keep

    def apply(self, c: Candidates) -> None:
        c.n = k.top_p(c.ids, c.logits, c.probs, c.n, c.is_sorted, self.p, self.min_keep)
        c.is_sorted = True


class MinP(_Sampler):
    """llama_sampler_min_p: keep tokens with probability >= p * the best one's."""

    keeps_order = False

    def __init__(self, p: float, min_keep: int) -> None:
        self.p, self.min_keep = np.float32(p), min_keep

    def apply(self, c: Candidates) -> None:
        c.n, c.is_sorted = k.min_p(c.ids, c.logits, c.probs, c.n, c.is_sorted, self.p, self.min_keep)


class Xtc(_Seeded):
    """llama_sampler_xtc: with some probability, drop the best tokens above a threshold."""

    keeps_order = False

    def __init__(self, probability: float, threshold: float, min_keep: int, seed: int) -> None:
        super().__init__(seed)
        self.probability, self.threshold = np.float32(probability), np.float32(threshold)
        self.min_keep = min_keep

    def apply(self, c: Candidates) -> None:
        c.n, c.is_sorted = k.xtc(
            self.state, c.ids, c.logits, c.probs, c.n, c.is_sorted, self.probability, self.threshold,
            self.min_keep,
        )  # fmt: skip


class Temp(_Sampler):
    """llama_sampler_temp: divide logits by the temperature (<= 0: keep the best only)."""

    def __init__(self, t: float) -> None:
        self.t = np.float32(t)

    def apply(self, c: Candidates) -> None:
        k.temp(c.logits, c.n, self.t)


class TempExt(_Sampler):
    """llama_sampler_temp_ext: temperature, dynamic (entropy-based) when delta > 0."""

    def __init__(self, t: float, delta: float, exponent: float) -> None:
        self.t, self.delta, self.exponent = np.float32(t), np.float32(delta), np.float32(exponent)
        self.keeps_order = bool(self.delta <= 0)  # dynamic temperature sorts

    def apply(self, c: Candidates) -> None:
        c.is_sorted = k.temp_ext(
            c.ids, c.logits, c.probs, c.n, c.is_sorted, self.t, self.delta, self.exponent
        )


class Dist(_Seeded):
    """llama_sampler_dist: softmax and one seeded draw; selects the token."""

    def apply(self, c: Candidates) -> None:
        c.selected = k.dist(self.state, c.logits, c.probs, c.n, c.is_sorted)


class Mirostat(_Seeded):
    """llama_sampler_mirostat (v1): selects the token, adapts mu to the target surprise tau."""

    keeps_order = False

    def __init__(self, n_vocab: int, seed: int, tau: float, eta: float, m: int = 100) -> None:
        super().__init__(seed)
        self.n_vocab, self.m = n_vocab, m
        self.tau, self.eta = np.float32(tau), np.float32(eta)
        self.mu = np.array([np.float32(2.0) * self.tau], dtype=np.float32)

    def apply(self, c: Candidates) -> None:
        c.n, c.selected = k.mirostat(
            self.state, c.ids, c.logits, c.probs, c.n, c.is_sorted, self.n_vocab, self.tau, self.eta,
            self.m, self.mu,
        )  # fmt: skip
        c.is_sorted = True

    def reset(self) -> None:
        super().reset()
        self.mu[0] = np.float32(2.0) * self.tau


class MirostatV2(_Seeded):
    """llama_sampler_mirostat_v2: selects the token, adapts mu to the target surprise tau."""

    keeps_order = False

    def __init__(self, seed: int, tau: float, eta: float) -> None:
        super().__init__(seed)
        self.tau, self.eta = np.float32(tau), np.float32(eta)
        self.mu = np.array([np.float32(2.0) * self.tau], dtype=np.float32)

    def apply(self, c: Candidates) -> None:
        c.n, c.selected = k.mirostat_v2(
            self.state, c.ids, c.logits, c.probs, c.n, c.is_sorted, self.tau, self.eta, self.mu
        )
        c.is_sorted = True

    def reset(self) -> None:
        super().reset()
        self.mu[0] = np.float32(2.0) * self.tau
