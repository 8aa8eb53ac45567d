"""Sampling parameters: llama.cpp's ``common_params_sampling`` as a frozen struct.

Field names are the server's request names (``temperature``, ``repeat_last_n`` ...); defaults are
llama.cpp's (common/common.h). ``validate()`` rejects values llama.cpp cannot give a meaning to;
values llama.cpp treats as "off" (top_k <= 0, top_p = 1, min_p = 0, typical_p >= 1, ...) are valid.
"""

from __future__ import annotations

import math

import msgspec

from ..grammar.triggers import GrammarTrigger, TriggerPatterns, TriggerType, trigger_patterns
from .reasoning_budget import ReasoningBudgetParams
from .rng import LLAMA_DEFAULT_SEED

__all__ = [
    "DEFAULT_DRY_SEQUENCE_BREAKERS",
    "DEFAULT_SAMPLERS",
    "MAX_N_PROBS",
    "SAMPLER_NAMES",
    "GrammarTrigger",
    "SamplingParams",
    "TriggerType",
    "parse_samplers",
]

# common_sampler_type canonical names that the chain implements, and their one-letter codes
SAMPLER_NAMES: dict[str, str] = {
    "penalties": "e",
    "dry": "d",
    "top_n_sigma": "s",
    "top_k": "k",
    "typ_p": "y",
    "top_p": "p",
    "min_p": "m",
    "xtc": "x",
    "temperature": "t",
}
DEFAULT_SAMPLERS: tuple[str, ...] = (
    "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
)  # fmt: skip
DEFAULT_DRY_SEQUENCE_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")
MAX_N_PROBS = 1024  # bound on probabilities reported per token

_ALIASES: dict[str, str] = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"}
for _name in SAMPLER_NAMES:
    _ALIASES[_name] = _name
    if "_" in _name:
        _ALIASES[_name.replace("_", "-")] = _name
        _ALIASES[_name.replace("_", "")] = _name
_BY_CHAR = {c: name for name, c in SAMPLER_NAMES.items()}


def parse_samplers(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Sampler order from names (case-insensitive, aliases as llama.cpp) or a string of letters.

    Unknown names or letters are skipped, like ``common_sampler_types_from_names/_chars``.
    """
    if isinstance(value, str):
        return tuple(_BY_CHAR[c] for c in value if c in _BY_CHAR)
    return tuple(_ALIASES[v.lower()] for v in value if v.lower() in _ALIASES)


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """One request's sampling settings (immutable). Build once, ``validate()``, pass to ``Sampler``."""

    temperature: float = 0.8  # <= 0: keep only the most likely token
    dynatemp_range: float = 0.0  # > 0: entropy-based temperature in [t - range, t + range]
    dynatemp_exponent: float = 1.0
    top_k: int = 40  # <= 0: off
    top_p: float = 0.95  # 1: off
    min_p: float = 0.05  # 0: off
    typical_p: float = 1.0  # >= 1: off
    xtc_probability: float = 0.0  # 0: off
    xtc_threshold: float = 0.1  # > 0.5: off
    top_n_sigma: float = -1.0  # <= 0: off
    repeat_last_n: int = 64  # 0: off, -1: the context size
    repeat_penalty: float = 1.0  # 1: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0  # 0: off
    dry_base: float = 1.75  # < 1: off
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # 0: off, -1: the context size
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_SEQUENCE_BREAKERS
    mirostat: int = 0  # 0: off, 1: Mirostat, 2: Mirostat 2.0 (replaces the chain)
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int = LLAMA_DEFAULT_SEED  # LLAMA_DEFAULT_SEED (or -1): random
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias); bias -inf bans the token
    ignore_eos: bool = False  # ban every end-of-generation token
    n_probs: int = 0  # > 0: report the top n_probs probabilities per token
    min_keep: int = 0  # samplers keep at least this many candidates
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    grammar: str = ""  # GBNF text constraining the output ("": none); start symbol `root`
    grammar_lazy: bool = False  # unconstrained until a trigger appears (then the grammar applies)
    grammar_triggers: tuple[GrammarTrigger, ...] = ()  # words, patterns, pattern_full, token ids
    preserved_tokens: tuple[int, ...] = ()  # special tokens whose text is output (not hidden)
    grammar_prefill: tuple[int, ...] = ()  # tokens fed to the grammar first (e.g. a generation prompt)
    reasoning_budget: ReasoningBudgetParams | None = None  # a token budget for the thinking block

    def validate(self) -> SamplingParams:
        """Return self, or raise ValueError naming the first invalid field."""
        for name in (
            "dynatemp_range", "dynatemp_exponent", "presence_penalty", "frequency_penalty",
            "dry_multiplier", "dry_base", "mirostat_tau", "mirostat_eta",
        ):  # fmt: skip
            _finite(name, getattr(self, name))
        for name in ("temperature", "top_n_sigma", "typical_p"):
            if math.isnan(getattr(self, name)):
                raise ValueError(f"{name} must be a number, got nan")
        for name in ("top_p", "min_p", "xtc_probability", "xtc_threshold"):
            _between(name, getattr(self, name), 0.0, 1.0)
        if self.typical_p < 0:
            raise ValueError(f"typical_p must be >= 0, got {self.typical_p}")
        _int_between("top_k", self.top_k, -(2**31), 2**31 - 1)
        _int_between("repeat_last_n", self.repeat_last_n, -1, 2**31 - 1)
        _int_between("dry_penalty_last_n", self.dry_penalty_last_n, -1, 2**31 - 1)
        _int_between("dry_allowed_length", self.dry_allowed_length, 0, 2**31 - 1)
        _int_between("mirostat", self.mirostat, 0, 2)
        _int_between("seed", self.seed, -1, 0xFFFFFFFF)
        _int_between("n_probs", self.n_probs, 0, MAX_N_PROBS)
        _int_between("min_keep", self.min_keep, 0, 2**31 - 1)
        # common_sampler_init: "penalty_repeat must be finite and greater than 0"
        if not (math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0):
            raise ValueError(f"repeat_penalty must be finite and greater than 0, got {self.repeat_penalty}")
        if not math.isfinite(1.0 / self.repeat_penalty) or self.repeat_penalty < 1.1754943508222875e-38:
            raise ValueError(f"repeat_penalty is too small, got {self.repeat_penalty}")
        if not all(isinstance(b, str) for b in self.dry_sequence_breakers):
            raise ValueError("dry_sequence_breakers must be strings")
        for name in self.samplers:
            if name not in SAMPLER_NAMES:
                raise ValueError(f"samplers: unknown sampler {name!r} (known: {', '.join(SAMPLER_NAMES)})")
        self._validate_grammar()
        if self.reasoning_budget is not None:
            self.reasoning_budget.validate()
        for entry in self.logit_bias:
            if len(entry) != 2:
                raise ValueError(f"logit_bias entries must be (token, bias) pairs, got {entry!r}")
            token, bias = entry
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias token must be a non-negative int, got {token!r}")
            if math.isnan(bias) or bias == math.inf:
                raise ValueError(f"logit_bias bias for token {token} must be a number or -inf, got {bias}")
        return self

    def _validate_grammar(self) -> None:
        """Grammar fields (the grammar text itself is checked by ``parse_grammar`` when used)."""
        if not isinstance(self.grammar, str):
            raise ValueError("grammar must be a string")
        if self.grammar_lazy and self.grammar and not self.grammar_triggers:
            raise ValueError("no triggers set for lazy grammar")
        for t in self.grammar_triggers:
            if t.type == TriggerType.TOKEN and t.token < 0:
                raise ValueError(f"grammar_triggers: token trigger needs a token id, got {t.token}")
        TriggerPatterns(trigger_patterns(self.grammar_triggers)[0])  # raises on an invalid pattern
        for name in ("preserved_tokens", "grammar_prefill"):
            for tid in getattr(self, name):
                if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
                    raise ValueError(f"{name} entries must be non-negative token ids, got {tid!r}")


def _finite(name: str, v: float) -> None:
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v}")


def _between(name: str, v: float, lo: float, hi: float) -> None:
    if not (lo <= v <= hi):
        raise ValueError(f"{name} must be between {lo} and {hi}, got {v}")


def _int_between(name: str, v: int, lo: int, hi: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    if not (lo <= v <= hi):
        raise ValueError(f"{name} must be between {lo} and {hi}, got {v}")
