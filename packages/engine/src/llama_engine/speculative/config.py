"""Speculative decoding settings: llama.cpp's `common_params_speculative`, decided once at the edge.

Names, defaults and validation messages follow llama.cpp (common/arg.cpp, common/speculative.cpp), so a
command line that works there works here.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "DraftParams",
    "NgramMapParams",
    "NgramModParams",
    "SpecType",
    "SpeculativeConfig",
    "parse_spec_types",
    "spec_type_names",
]


class SpecType(enum.IntEnum):
    """llama.cpp's `common_speculative_type` (same order: the names list in `--help` follows it)."""

    NONE = 0
    DRAFT_SIMPLE = 1
    DRAFT_EAGLE3 = 2
    DRAFT_MTP = 3
    DRAFT_DFLASH = 4
    DRAFT_DSPARK = 5
    NGRAM_SIMPLE = 6
    NGRAM_MAP_K = 7
    NGRAM_MAP_K4V = 8
    NGRAM_MOD = 9
    NGRAM_CACHE = 10

    @property
    def label(self) -> str:
        """The name on the command line (`draft-simple`, `ngram-map-k4v`, ...)."""
        return self.name.lower().replace("_", "-")


# drafters a model file of its own would drive, which this engine does not implement
UNSUPPORTED = frozenset(
    {SpecType.DRAFT_EAGLE3, SpecType.DRAFT_MTP, SpecType.DRAFT_DFLASH, SpecType.DRAFT_DSPARK}
)
# llama.cpp's priority order: the first drafter that proposes something wins for that sequence
PRIORITY = (
    SpecType.NGRAM_SIMPLE,
    SpecType.NGRAM_MAP_K,
    SpecType.NGRAM_MAP_K4V,
    SpecType.NGRAM_MOD,
    SpecType.NGRAM_CACHE,
    SpecType.DRAFT_SIMPLE,
)
NGRAM_CACHE_N_DRAFT = 8  # llama.cpp drafts at most 8 tokens from the n-gram cache


def spec_type_names() -> str:
    """Every type name, comma-separated (the `--spec-type` help)."""
    return ",".join(t.label for t in SpecType)


def parse_spec_types(names: Iterable[str]) -> tuple[SpecType, ...]:
    """Types from their names; `none` anywhere means none at all. ValueError on an unknown name."""
    by_label = {t.label: t for t in SpecType}
    out: list[SpecType] = []
    for raw in names:
        name = raw.strip()
        if name not in by_label:
            raise ValueError(f"unknown speculative type: {name}")
        if by_label[name] == SpecType.NONE:
            return (SpecType.NONE,)
        out.append(by_label[name])
    return tuple(out)


@dataclass(frozen=True, slots=True)
class DraftParams:
    """The draft model's settings (`--spec-draft-*`)."""

    model: str = ""  # -md: the draft GGUF file
    n_max: int = 3  # tokens drafted per step
    n_min: int = 0  # fewer drafted tokens than this: no draft
    p_min: float = 0.0  # stop drafting when the draft's best candidate is less likely than this
    p_split: float = (
        0.1  # accepted for compatibility (tree drafting is not implemented, nor in llama.cpp's server)
    )
    probabilistic: bool = False  # sample the draft and verify by rejection sampling (temperature > 0)
    cache_type_k: str = "f16"  # the draft's own KV cache types (-ctkd/-ctvd)
    cache_type_v: str = "f16"
    # -fa on|off|auto, resolved for the draft's own cache types and head size by the target's rules
    # (kv_types.resolve_flash_attn): llama.cpp gives the draft context the target's flash_attn_type
    flash_attn: str = "auto"


@dataclass(frozen=True, slots=True)
class NgramMapParams:
    """ngram-simple / ngram-map-k / ngram-map-k4v: key n-gram length, drafted m-gram length, min hits."""

    size_n: int = 12
    size_m: int = 48
    min_hits: int = 1


@dataclass(frozen=True, slots=True)
class NgramModParams:
    """ngram-mod: hashed lookup of `n_match` tokens, drafts of n_min..n_max tokens."""

    n_match: int = 24
    n_min: int = 48
    n_max: int = 64


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """All speculative settings of one engine. `types` empty or (NONE,): no speculative decoding."""

    types: tuple[SpecType, ...] = ()
    draft: DraftParams = field(default_factory=DraftParams)
    ngram_simple: NgramMapParams = field(default_factory=NgramMapParams)
    ngram_map_k: NgramMapParams = field(default_factory=NgramMapParams)
    ngram_map_k4v: NgramMapParams = field(default_factory=NgramMapParams)
    ngram_mod: NgramModParams = field(default_factory=NgramModParams)
    lookup_cache_static: str = ""  # -lcs: read at start-up
    lookup_cache_dynamic: str = ""  # -lcd: read at start-up (if present), written back at shutdown
    synth_len: float = -1.0  # --spec-synth-len (-1: unset)
    synth_rates: tuple[float, ...] = ()  # --spec-synth-rates
    adaptive: bool = True  # shorter / paused drafts after rejections (`backoff`); False: fixed n_max

    @property
    def enabled(self) -> tuple[SpecType, ...]:
        """The drafters to run, in llama.cpp's priority order."""
        if SpecType.NONE in self.types and len(self.types) == 1:
            return ()
        return tuple(t for t in PRIORITY if t in self.types)

    @property
    def has_synth(self) -> bool:
        return self.synth_len != -1.0 or bool(self.synth_rates)

    @property
    def label(self) -> str:
        """`speculative.types` of generation settings, as llama.cpp prints them."""
        return ",".join(t.label for t in self.types) if self.types else "none"

    def n_max_of(self, t: SpecType) -> int:
        """The most tokens drafter `t` proposes in one step."""
        if t == SpecType.DRAFT_SIMPLE:
            return max(0, self.draft.n_max)
        if t == SpecType.NGRAM_SIMPLE:
            return self.ngram_simple.size_m
        if t == SpecType.NGRAM_MAP_K:
            return self.ngram_map_k.size_m
        if t == SpecType.NGRAM_MAP_K4V:
            return self.ngram_map_k4v.size_m
        if t == SpecType.NGRAM_MOD:
            return max(0, self.ngram_mod.n_max)
        if t == SpecType.NGRAM_CACHE:
            return NGRAM_CACHE_N_DRAFT
        return 0

    @property
    def n_max(self) -> int:
        """The longest draft of any enabled drafter."""
        return max((self.n_max_of(t) for t in self.enabled), default=0)

    def validate(self) -> SpeculativeConfig:
        """Check what llama.cpp checks at start-up; ValueError with its message otherwise."""
        for t in self.enabled:
            if t in UNSUPPORTED:
                raise ValueError(f"speculative type {t.label} is not supported by this server")
        if SpecType.DRAFT_SIMPLE in self.enabled and not self.draft.model:
            raise ValueError("draft-simple requires a draft model (--spec-draft-model)")
        if self.draft.n_max < 0:
            raise ValueError("--spec-draft-n-max: invalid value")
        self.synth_rates_resolved()
        if self.has_synth and not self.enabled:
            raise ValueError("synthetic acceptance requires an initialized speculative decoding context")
        return self

    def synth_rates_resolved(self) -> tuple[float, ...]:
        """The unconditional acceptance rate per draft position (llama.cpp's synth_rates_resolve)."""
        if not self.has_synth:
            return ()
        if self.synth_len != -1.0 and self.synth_rates:
            raise ValueError("synthetic acceptance length and rates are mutually exclusive")
        n_max = self.n_max
        if n_max <= 0:
            raise ValueError("synthetic acceptance requires at least one speculative token")
        if self.synth_rates:
            return _checked_rates(self.synth_rates, n_max)
        return _rates_of_length(self.synth_len, n_max)

    def synth_probs(self) -> tuple[float, ...]:
        """Conditional acceptance probability per position: rate_i / rate_{i-1}."""
        out, prev = [], 1.0
        for rate in self.synth_rates_resolved():
            out.append(rate / prev if prev > 0.0 else 0.0)
            prev = rate
        return tuple(out)


def _checked_rates(rates: tuple[float, ...], n_max: int) -> tuple[float, ...]:
    if len(rates) != n_max:
        raise ValueError(f"synthetic acceptance rates must contain {n_max} values, got {len(rates)}")
    for i, r in enumerate(rates):
        if not math.isfinite(r) or r < 0.0 or r > 1.0:
            raise ValueError("synthetic acceptance rates must be finite and within [0, 1]")
        if i > 0 and r > rates[i - 1]:
            raise ValueError("synthetic acceptance rates must be monotonically non-increasing")
    return rates


def _rates_of_length(length: float, n_max: int) -> tuple[float, ...]:
    """Geometric rates p, p^2, ... whose mean acceptance length (with the target token) is `length`."""
    length_max = float(n_max) + 1.0
    if not math.isfinite(length) or length < 1.0 or length > length_max:
        raise ValueError(f"synthetic acceptance length must be finite and within [1, {length_max:.0f}]")
    p = 0.0
    if length == length_max:
        p = 1.0
    elif length > 1.0:
        lo, hi = 0.0, 1.0
        for _ in range(32):  # bisection on sum_{j=1..n_max} p^j = length - 1
            mid = 0.5 * (lo + hi)
            total, term = 0.0, mid
            for _ in range(n_max):
                total += term
                term *= mid
            lo, hi = (mid, hi) if total < length - 1.0 else (lo, mid)
        p = 0.5 * (lo + hi)
    rates, rate = [], p
    for _ in range(n_max):  # repeated products, as llama.cpp computes them
        rates.append(rate)
        rate *= p
    return tuple(rates)
