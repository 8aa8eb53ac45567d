"""Results of generation requests: accumulating events, and the wire pieces every format shares
(`timings`, probabilities, usage, errors, stop types, ids)."""

from __future__ import annotations

import math
import secrets
import string
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec
from msgspec import Struct

from llama_engine import FinalEvent, StopReason, Timings, TokenEvent
from llama_engine.tokenizer import Tokenizer

__all__ = [
    "ApiTimings",
    "ApiUsage",
    "CachedTokens",
    "Choice",
    "ErrorBody",
    "ErrorObject",
    "LogprobsContent",
    "Probs",
    "completion_id",
    "error_of",
    "finish_reason",
    "prob_entry",
    "random_id",
    "stop_type",
    "timings_out",
    "usage_of",
]

_ALNUM = string.ascii_letters + string.digits
LOGPROB_ZERO = -3.4028234663852886e38  # ln(0) reported as the most negative finite float32


def random_id(n: int = 32) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


def completion_id() -> str:
    return "chatcmpl-" + random_id()


class ApiTimings(Struct, gc=False):
    """llama.cpp's `timings` object (endpoints.md §2.3)."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    draft_n: int | msgspec.UnsetType = msgspec.UNSET  # only when speculative decoding drafted
    draft_n_accepted: int | msgspec.UnsetType = msgspec.UNSET


class _Piece(Struct, gc=False):
    id: int
    token: str  # the piece cut to its longest valid UTF-8 prefix
    raw: list[int] = msgspec.field(name="bytes")


class TopLogprob(_Piece):
    logprob: float


class TokenLogprob(_Piece):
    logprob: float
    top_logprobs: list[TopLogprob]


class TopProb(_Piece):
    prob: float


class TokenProb(_Piece):
    prob: float
    top_probs: list[TopProb]


Probs = TokenLogprob | TokenProb  # one entry of `completion_probabilities` / `logprobs.content` (§2.4)


class LogprobsContent(Struct, gc=False):
    content: list[Probs]


class CachedTokens(Struct, gc=False):
    cached_tokens: int


class ApiUsage(Struct, gc=False):
    """OpenAI's `usage` (completions and chat)."""

    completion_tokens: int
    prompt_tokens: int
    total_tokens: int
    prompt_tokens_details: CachedTokens


class ErrorObject(Struct, gc=False):
    code: int
    message: str
    type: str


class ErrorBody(Struct, gc=False):
    """The error object (endpoints.md §0.3); mid-stream it is the stream's last event."""

    error: ErrorObject


@dataclass(slots=True)
class Choice:
    """Everything one engine request produced (a non-streamed result)."""

    index: int
    content: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    probs: list[Probs] = field(default_factory=list)
    final: FinalEvent | None = None

    @property
    def text(self) -> str:
        return "".join(self.content)

    def add(self, ev: TokenEvent | FinalEvent, probs: Probs | None) -> None:
        if isinstance(ev, TokenEvent):
            self.content.append(ev.text)
            self.tokens.append(ev.token)
            if probs is not None:
                self.probs.append(probs)
        else:
            self.final = ev
            if ev.text:
                self.content.append(ev.text)


def error_of(finals: Iterable[FinalEvent | None]) -> str | None:
    """The first error among finished requests (the whole response is then that error)."""
    for f in finals:
        if f is not None and f.reason == StopReason.ERROR:
            return f.error or "generation failed"
    return None


_STOP_TYPES = {StopReason.EOS: "eos", StopReason.STOP_WORD: "word", StopReason.LENGTH: "limit"}


def stop_type(final: FinalEvent | None) -> str:
    return "none" if final is None else _STOP_TYPES.get(final.reason, "none")


def finish_reason(final: FinalEvent | None, tool_calls: bool = False) -> str | None:
    if final is None:
        return None
    if final.reason == StopReason.LENGTH:
        return "length"
    return "tool_calls" if tool_calls else "stop"


def usage_of(finals: list[FinalEvent], one_prompt: bool = False) -> ApiUsage:
    """OpenAI usage over several requests. `one_prompt`: the `n` choices of one chat prompt count its
    tokens once (and its cache hit at most once); several prompts add up."""
    prompt = sum(f.usage.prompt_tokens for f in finals)
    cached = sum(f.usage.cached_tokens for f in finals)
    if one_prompt:
        prompt //= max(len(finals), 1)
        cached = max((f.usage.cached_tokens for f in finals), default=0)
    completion = sum(f.usage.completion_tokens for f in finals)
    return ApiUsage(completion, prompt, prompt + completion, CachedTokens(cached))


def timings_out(t: Timings) -> ApiTimings:
    """llama.cpp's `timings` object (endpoints.md §2.3): all finite, >= 0."""
    prompt_ms = max(t.prompt_ms, 0.0)
    predicted_ms = max(t.predicted_ms, 0.001 if t.predicted_n else 0.0)
    n_gen = t.predicted_n - 1  # the first token comes from the prompt batch
    return ApiTimings(
        cache_n=t.cache_n,
        prompt_n=t.prompt_n,
        prompt_ms=prompt_ms,
        prompt_per_token_ms=prompt_ms / t.prompt_n if t.prompt_n else 0.0,
        prompt_per_second=1e3 / prompt_ms * t.prompt_n if prompt_ms > 0 else 0.0,
        predicted_n=t.predicted_n,
        predicted_ms=predicted_ms,
        predicted_per_token_ms=predicted_ms / n_gen if n_gen > 0 else 0.0,
        predicted_per_second=1e3 / predicted_ms * n_gen if n_gen > 0 else 0.0,
        draft_n=t.draft_n if t.draft_n else msgspec.UNSET,
        draft_n_accepted=t.draft_n_accepted if t.draft_n else msgspec.UNSET,
    )


class _Pieces:
    """Each token's piece as (longest valid UTF-8 prefix, raw bytes), decoded once per tokenizer: a stream
    with `n_probs` 1024 asks for 1024 pieces per token."""

    def __init__(self, tok: Tokenizer, special: bool) -> None:
        self.tok = tok
        self.special = special
        self.cache: dict[int, tuple[str, list[int]]] = {}

    def __getitem__(self, token: int) -> tuple[str, list[int]]:
        hit = self.cache.get(token)
        if hit is None:
            raw = self.tok.token_to_piece(token, special=self.special)
            hit = self.cache[token] = (_valid_prefix(raw), list(raw))
        return hit


def _valid_prefix(raw: bytes) -> str:
    for cut in range(len(raw), max(len(raw) - 4, -1), -1):
        try:
            return raw[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return raw.decode("utf-8", "ignore")


_pieces: dict[tuple[int, bool], _Pieces] = {}  # by id(): a Tokenizer has slots and no weak references


def _pieces_of(tok: Tokenizer, special: bool) -> _Pieces:
    key = (id(tok), special)
    p = _pieces.get(key)
    if p is None or p.tok is not tok:
        p = _pieces[key] = _Pieces(tok, special)
    return p


def _logprob(p: float) -> float:
    return math.log(p) if p > 0 else LOGPROB_ZERO


def prob_entry(tok: Tokenizer, ev: TokenEvent, post_sampling: bool, special: bool = False) -> Probs:
    """One entry of `completion_probabilities` / `logprobs.content` (endpoints.md §2.4). As llama-server, a
    special token's piece is empty unless `special` (`-sp`)."""
    pieces = _pieces_of(tok, special)
    text, raw = pieces[ev.token]
    if post_sampling:
        tops = [TopProb(tid, *pieces[tid], p) for tid, p in ev.top if p > 0]
        return TokenProb(ev.token, text, raw, ev.prob, tops)
    top = [TopLogprob(tid, *pieces[tid], _logprob(p)) for tid, p in ev.top]
    return TokenLogprob(ev.token, text, raw, _logprob(ev.prob), top)
