"""Generation parameters (endpoints.md §2.1) mapped onto engine requests.

The request fields are typed and range-checked by their Structs in `schemas`; here "clamp" fields are
clamped when mapped onto `SamplingParams` (as llama.cpp does), `logit_bias` text keys are limited and
tokenized, and one `GenerationRequest` is built per prompt and choice.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import msgspec

from llama_engine import GenerationRequest, SamplingParams
from llama_engine.sampling import parse_samplers
from llama_engine.tokenizer import Tokenizer

from .config import ServerConfig
from .errors import ApiError
from .lora import request_scales
from .schemas import MAX_BIAS_TEXT_CHARS, GenParams, bias_pairs, bias_text_keys, token_id
from .structured import GrammarFields, grammar_fields

if TYPE_CHECKING:
    from .state import ServerState

__all__ = [
    "MAX_BIAS_TEXT_CHARS",
    "GenParams",
    "build_request",
    "build_requests",
    "resolve_logit_bias",
    "sampling_params",
]

_BIAS_KEY_CHARS = 1024  # a text key is tokenized from this many characters at most

Bias = tuple[tuple[int, float], ...]


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def _clamp(v: float, lo: float, hi: float) -> float:
    return min(max(v, lo), hi)


def sampling_params(
    p: GenParams, cfg: ServerConfig, tok: Tokenizer, n_probs: int | None = None, bias: Bias | None = None
) -> SamplingParams:
    """Map the request fields onto SamplingParams over the server defaults (clamps as llama.cpp).
    `bias`: the request's logit_bias already resolved (`resolve_logit_bias`); None resolves it here."""
    d = cfg.sampling
    dry_base = _pick(p.dry_base, d.dry_base)
    if dry_base < 1.0:
        dry_base = d.dry_base
    samplers = d.samplers
    if p.samplers is not None:
        samplers = parse_samplers(p.samplers)
    if bias is None:
        bias = _logit_bias(p.logit_bias, tok) if p.logit_bias is not None else d.logit_bias
    ignore_eos = _pick(p.ignore_eos, d.ignore_eos)
    seed = _pick(p.seed, d.seed)
    try:
        return SamplingParams(
            temperature=max(_pick(p.temperature, d.temperature), 0.0),
            dynatemp_range=_pick(p.dynatemp_range, d.dynatemp_range),
            dynatemp_exponent=_pick(p.dynatemp_exponent, d.dynatemp_exponent),
            top_k=max(_pick(p.top_k, d.top_k), 0),
            top_p=_clamp(_pick(p.top_p, d.top_p), 0.0, 1.0),
            min_p=_clamp(_pick(p.min_p, d.min_p), 0.0, 1.0),
            typical_p=max(_pick(p.typical_p, d.typical_p), 0.0),
            xtc_probability=_clamp(_pick(p.xtc_probability, d.xtc_probability), 0.0, 1.0),
            xtc_threshold=_clamp(_pick(p.xtc_threshold, d.xtc_threshold), 0.0, 1.0),
            top_n_sigma=_pick(p.top_n_sigma, d.top_n_sigma),
            repeat_last_n=_pick(p.repeat_last_n, d.repeat_last_n),
            repeat_penalty=_pick(p.repeat_penalty, d.repeat_penalty),
            presence_penalty=_pick(p.presence_penalty, d.presence_penalty),
            frequency_penalty=_pick(p.frequency_penalty, d.frequency_penalty),
            dry_multiplier=_pick(p.dry_multiplier, d.dry_multiplier),
            dry_base=dry_base,
            dry_allowed_length=_pick(p.dry_allowed_length, d.dry_allowed_length),
            dry_penalty_last_n=_pick(p.dry_penalty_last_n, d.dry_penalty_last_n),
            dry_sequence_breakers=tuple(_pick(p.dry_sequence_breakers, d.dry_sequence_breakers)),
            mirostat=int(_clamp(_pick(p.mirostat, d.mirostat), 0, 2)),
            mirostat_tau=_pick(p.mirostat_tau, d.mirostat_tau),
            mirostat_eta=_pick(p.mirostat_eta, d.mirostat_eta),
            seed=0xFFFFFFFF if seed == -1 else seed,
            logit_bias=bias,
            ignore_eos=ignore_eos,
            n_probs=_pick(n_probs if n_probs is not None else p.n_probs, d.n_probs),
            min_keep=_pick(p.min_keep, d.min_keep),
            samplers=samplers,
        ).validate()
    except ValueError as e:
        raise ApiError(f"Invalid sampling parameters: {e}") from e


def _logit_bias(value: Any, tok: Tokenizer) -> Bias:
    """The (token id, bias) pairs: ids outside the vocabulary are ignored; text is tokenized without
    special tokens; `false` bans the token."""
    out: list[tuple[int, float]] = []
    n_vocab = tok.n_vocab
    for key, bias in bias_pairs(value):
        if bias is False:
            b = -math.inf
        elif isinstance(bias, int | float) and not isinstance(bias, bool) and math.isfinite(bias):
            b = float(bias)
        else:
            continue
        tid = token_id(key)
        if tid is not None:
            ids = [tid]
        elif isinstance(key, str):
            ids = tok.encode(key[:_BIAS_KEY_CHARS], add_special=False, parse_special=False)
        else:
            continue
        out.extend((t, b) for t in ids if 0 <= t < n_vocab)
    return tuple(out)


async def resolve_logit_bias(state: ServerState, value: Any) -> Bias:
    """The request's logit_bias as (id, bias) pairs (the server default when absent), tokenized off the
    event loop when it has text keys (their size was checked when the body was decoded)."""
    if value is None:
        return state.config.sampling.logit_bias
    tok = state.require_engine().tokenizer
    if not bias_text_keys(value):
        return _logit_bias(value, tok)
    return await state.offload(_logit_bias, value, tok)


def build_request(
    p: GenParams,
    prompt: list[int],
    cfg: ServerConfig,
    tok: Tokenizer,
    n_slots: int,
    n_probs: int | None = None,
    seed_offset: int = 0,
    bias: Bias | None = None,
    grammar: GrammarFields | None = None,
) -> GenerationRequest:
    """One engine request from the parameters and one tokenized prompt."""
    sp = sampling_params(p, cfg, tok, n_probs, bias)
    if grammar is not None:
        sp = msgspec.structs.replace(sp, **msgspec.structs.asdict(grammar))
    if seed_offset and sp.seed != 0xFFFFFFFF:
        sp = msgspec.structs.replace(sp, seed=(sp.seed + seed_offset) & 0xFFFFFFFF)
    slot = _pick(p.id_slot, -1)
    priority = _pick(p.priority, 0)
    if priority and cfg.scheduling_policy != "priority":  # vLLM's answer
        raise ApiError(f"Got priority {priority} but Priority scheduling is not enabled.")
    return GenerationRequest(
        prompt=prompt,
        max_tokens=p.n_predict_value(cfg),
        sampling=sp,
        stop=p.stop_list(cfg),
        cache_prompt=_pick(p.cache_prompt, cfg.cache_prompt),
        n_cache_reuse=_pick(p.n_cache_reuse, cfg.n_cache_reuse),
        slot=slot % n_slots if slot >= 0 else -1,
        n_keep=_pick(p.n_keep, cfg.n_keep),  # -1 (the whole prompt) is resolved by the engine's shift
        n_discard=_pick(p.n_discard, 0),
        context_shift=cfg.context_shift,
        post_sampling_probs=bool(p.post_sampling_probs),
        timings_per_token=bool(p.timings_per_token),
        return_progress=bool(p.return_progress and p.stream),  # progress events exist only in a stream
        special=cfg.special,
        priority=priority,
    )


async def build_requests(
    state: ServerState, p: GenParams, prompts: list[list[int]], n_probs: int | None = None
) -> list[GenerationRequest]:
    """The engine requests of one HTTP request: for each prompt, `n` choices (seeds offset by the choice
    index). logit_bias is resolved once for all of them, off the event loop."""
    cfg = state.config
    tok = state.require_engine().tokenizer
    n_slots = cfg.n_parallel
    n = p.n_choices(n_slots)
    bias = await resolve_logit_bias(state, p.logit_bias)
    grammar = await grammar_fields(state, p)
    lora = request_scales(state, p.lora)
    return [
        msgspec.structs.replace(
            build_request(p, prompt, cfg, tok, n_slots, n_probs, i, bias, grammar),
            lora=lora,
            shared_prompt=n > 1,  # llama.cpp's n_cmpl > 1 child tasks refuse a context shift
        )
        for prompt in prompts
        for i in range(n)
    ]
