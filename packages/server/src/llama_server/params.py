"""Generation parameters of every generation endpoint (endpoints.md §2.1), validated at the edge.

Types and strict ranges are declared on the msgspec Structs (a wrong type, a number out of range, NaN or a
huge number is a 400 before anything reaches the engine); "clamp" fields are clamped when mapped onto
`SamplingParams`. `null` means "use the server default".
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import msgspec

from llama_engine import GenerationRequest, SamplingParams
from llama_engine.sampling import MAX_N_PROBS, parse_samplers
from llama_engine.tokenizer import Tokenizer

from .config import ServerConfig
from .errors import ApiError

__all__ = ["INT32_MAX", "GenParams", "StreamOptions", "build_request", "decode_body"]

INT32_MAX = 2**31 - 1
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=INT32_MAX)]
NPredict = Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]
NonNeg = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
Seed = Annotated[int, msgspec.Meta(ge=-1, le=0xFFFFFFFF)]
NProbs = Annotated[int, msgspec.Meta(ge=0, le=MAX_N_PROBS)]
Float = Annotated[float, msgspec.Meta(ge=-1e30, le=1e30)]  # finite and sane
Stop = Annotated[str, msgspec.Meta(max_length=4096)]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class GenParams(msgspec.Struct, kw_only=True):
    """The §2.1 fields shared by /completion, /v1/completions and /v1/chat/completions."""

    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n_predict: NPredict | None = None
    max_tokens: NPredict | None = None
    max_completion_tokens: NPredict | None = None
    temperature: Float | None = None
    dynatemp_range: Float | None = None
    dynatemp_exponent: Float | None = None
    top_k: Int32 | None = None
    top_p: Float | None = None
    min_p: Float | None = None
    top_n_sigma: Float | None = None
    typical_p: Float | None = None
    xtc_probability: Float | None = None
    xtc_threshold: Float | None = None
    repeat_penalty: Float | None = None
    repeat_last_n: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] | None = None
    presence_penalty: Float | None = None
    frequency_penalty: Float | None = None
    dry_multiplier: Float | None = None
    dry_base: Float | None = None
    dry_allowed_length: NonNeg | None = None
    dry_penalty_last_n: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] | None = None
    dry_sequence_breakers: Annotated[list[Stop], msgspec.Meta(min_length=1, max_length=64)] | None = None
    mirostat: Int32 | None = None
    mirostat_tau: Float | None = None
    mirostat_eta: Float | None = None
    seed: Seed | None = None
    n_keep: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] | None = None
    n_discard: NonNeg | None = None
    n_indent: NonNeg | None = None
    n_cmpl: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = None
    n_cache_reuse: NonNeg | None = None
    t_max_predict_ms: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] | None = None
    stop: Stop | Annotated[list[Stop], msgspec.Meta(max_length=64)] | None = None
    ignore_eos: bool | None = None
    logit_bias: Annotated[list[Any], msgspec.Meta(max_length=4096)] | dict[str, float | bool] | None = None
    n_probs: NProbs | None = None
    post_sampling_probs: bool | None = None
    min_keep: NonNeg | None = None
    samplers: (
        Annotated[list[Annotated[str, msgspec.Meta(max_length=32)]], msgspec.Meta(max_length=64)] | str | None
    ) = None
    grammar: str | None = None
    json_schema: Any = None
    cache_prompt: bool | None = None
    id_slot: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] | None = None
    return_tokens: bool | None = None
    return_progress: bool | None = None
    timings_per_token: bool | None = None
    sse_ping_interval: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] | None = None
    response_fields: Annotated[list[str], msgspec.Meta(max_length=64)] | None = None
    reasoning_format: str | None = None
    verbose: bool | None = None
    model: str | None = None

    def n_predict_value(self, cfg: ServerConfig) -> int:
        for v in (self.n_predict, self.max_completion_tokens, self.max_tokens):
            if v is not None:
                return v
        return cfg.n_predict

    def n_choices(self, n_slots: int) -> int:
        n = self.n_cmpl if self.n_cmpl is not None else (self.n if self.n is not None else 1)
        if n > n_slots:
            raise ApiError(f"Field 'n_cmpl': Value must be between 1 <= value <= {n_slots}, but got {n}")
        return n

    def stop_list(self, cfg: ServerConfig) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        stops = [s for s in stops if s]
        return stops or list(cfg.reverse_prompts)


def decode_body(raw: bytes, cls: type[Any]) -> Any:
    """Decode a JSON body into `cls`, answering every problem with a 400."""
    if not raw.strip():
        raise ApiError("Request body is empty: a JSON object is expected")
    try:
        return msgspec.json.decode(raw, type=cls)
    except msgspec.ValidationError as e:
        raise ApiError(f"Invalid request: {e}") from e
    except msgspec.DecodeError as e:
        raise ApiError(f"Invalid JSON: {e}") from e
    except RecursionError as e:
        raise ApiError("Invalid JSON: nested too deeply") from e


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def _clamp(v: float, lo: float, hi: float) -> float:
    return min(max(v, lo), hi)


def sampling_params(
    p: GenParams, cfg: ServerConfig, tok: Tokenizer, n_probs: int | None = None
) -> SamplingParams:
    """Map the request fields onto SamplingParams over the server defaults (clamps as llama.cpp)."""
    d = cfg.sampling
    dry_base = _pick(p.dry_base, d.dry_base)
    if dry_base < 1.0:
        dry_base = d.dry_base
    samplers = d.samplers
    if p.samplers is not None:
        samplers = parse_samplers(p.samplers)
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


def _logit_bias(value: Any, tok: Tokenizer) -> tuple[tuple[int, float], ...]:
    """llama.cpp's two forms: [[token|text, bias|false], ...] or {"token|text": bias}. Malformed entries
    are skipped; ids outside the vocabulary are ignored; text is tokenized without special tokens."""
    pairs: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        pairs = list(value.items())
    else:
        pairs = [tuple(e) for e in value if isinstance(e, list) and len(e) == 2]
    out: list[tuple[int, float]] = []
    n_vocab = tok.n_vocab
    for key, bias in pairs:
        if bias is False:
            b = -math.inf
        elif isinstance(bias, int | float) and not isinstance(bias, bool) and math.isfinite(bias):
            b = float(bias)
        else:
            continue
        ids: list[int] = []
        if isinstance(key, int) and not isinstance(key, bool):
            ids = [key]
        elif isinstance(key, str):
            try:
                ids = [int(key)]
            except ValueError:
                ids = tok.encode(key[:1024], add_special=False, parse_special=False)
        out.extend((t, b) for t in ids if 0 <= t < n_vocab)
    return tuple(out)


def build_request(
    p: GenParams,
    prompt: list[int],
    cfg: ServerConfig,
    tok: Tokenizer,
    n_slots: int,
    n_probs: int | None = None,
    seed_offset: int = 0,
) -> GenerationRequest:
    """One engine request from the parameters and one tokenized prompt."""
    if p.grammar or p.json_schema is not None:
        raise ApiError(
            "Grammars and JSON schemas are not supported by this server yet", "not_supported_error"
        )
    sp = sampling_params(p, cfg, tok, n_probs)
    if seed_offset and sp.seed != 0xFFFFFFFF:
        sp = msgspec.structs.replace(sp, seed=(sp.seed + seed_offset) & 0xFFFFFFFF)
    slot = _pick(p.id_slot, -1)
    return GenerationRequest(
        prompt=prompt,
        max_tokens=p.n_predict_value(cfg),
        sampling=sp,
        stop=p.stop_list(cfg),
        cache_prompt=_pick(p.cache_prompt, cfg.cache_prompt),
        slot=slot % n_slots if slot >= 0 else -1,
        n_keep=len(prompt) if _pick(p.n_keep, cfg.n_keep) == -1 else _pick(p.n_keep, cfg.n_keep),
        context_shift=cfg.context_shift,
        post_sampling_probs=bool(p.post_sampling_probs),
        timings_per_token=bool(p.timings_per_token),
    )
