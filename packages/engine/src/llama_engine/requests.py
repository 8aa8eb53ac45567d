"""What crosses the engine's seam: typed requests in, typed events out. No JSON, no dicts per token."""

from __future__ import annotations

import enum

import msgspec

from .sampling import SamplingParams

__all__ = [
    "EmbeddingRequest",
    "FinalEvent",
    "GenerationRequest",
    "Pooling",
    "ProgressEvent",
    "StopReason",
    "Timings",
    "TokenEvent",
    "Usage",
]


class StopReason(enum.IntEnum):
    """Why a generation ended (the server maps these to its own strings)."""

    EOS = 0  # an end-of-generation token
    LENGTH = 1  # max tokens, or the slot's context is full
    STOP_WORD = 2  # a stop string matched
    CANCELLED = 3  # the caller cancelled (or disconnected)
    ERROR = 4  # the request could not be served: see FinalEvent.error


class Pooling(enum.IntEnum):
    NONE = 0
    MEAN = 1
    CLS = 2
    LAST = 3
    RANK = 4  # a reranker's score: the last token through the model's classification head


class GenerationRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One completion: prompt token ids, sampling, and the conditions that end it."""

    prompt: list[int]
    max_tokens: int = -1  # -1: until end-of-generation or the context is full; 0: evaluate the prompt only
    sampling: SamplingParams = SamplingParams()
    stop: list[str] = []
    cache_prompt: bool = True  # reuse a cached prefix (this slot's or another's, of the same cache_scope)
    n_cache_reuse: int = 0  # also shift cached runs of at least this many tokens into place (0: off)
    slot: int = -1  # -1: the scheduler picks
    n_keep: int = 0  # tokens kept at the start when the context shifts (+1 for the BOS, as llama.cpp)
    n_discard: int = 0  # tokens dropped after n_keep when the context shifts; 0: half of the rest
    context_shift: bool = False  # shift (drop half after n_keep) instead of stopping when the context is full
    shared_prompt: bool = False  # one of n_cmpl > 1 choices of a prompt: a needed shift is an error instead
    post_sampling_probs: bool = False  # n_probs after the sampler chain instead of over the raw logits
    timings_per_token: bool = False  # every TokenEvent carries the request's timings so far
    return_progress: bool = False  # a ProgressEvent before the prompt is evaluated and after each chunk
    special: bool = False  # render special tokens in the text (llama-server's -sp), end-of-generation too
    lora: tuple[float, ...] = ()  # the scale of each of the engine's LoRA adapters (by id); () or 0: none
    # whose cache this request may reuse and fill: cached prefixes (slots, the RAM prompt cache, checkpoints,
    # shared drafting tables) computed under another scope are never reused, so a request's counters and
    # timings tell nothing about another scope's prompts ("": the one scope of a server without API keys)
    cache_scope: str = ""
    # under the engine's `priority` scheduling policy: lower values are served first (vLLM's meaning), and a
    # waiting request preempts a running one of a higher value; ignored under `fcfs`
    priority: int = 0


class EmbeddingRequest(msgspec.Struct, frozen=True, kw_only=True):
    prompt: list[int]
    pooling: Pooling = Pooling.MEAN
    normalize: int = 2  # -1 none, 0 max-abs, 1 taxicab, 2 euclidean, >2 p-norm (llama.cpp's embd_normalize)
    lora: tuple[float, ...] = ()  # the scale of each of the engine's LoRA adapters (by id); () or 0: none


class Usage(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


class Timings(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """llama.cpp's `timings`: prompt processing and generation, in milliseconds."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    cache_n: int
    draft_n: int = 0  # drafted tokens verified (speculative decoding)
    draft_n_accepted: int = 0  # of those, accepted


class TokenEvent(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """One generated token: its id, the text it completes (may be empty while UTF-8 or a possible stop
    string is held back), the top probabilities when asked for, and the timings so far when the request
    asked for `timings_per_token` (predicted_ms runs to this token)."""

    token: int
    text: str
    prob: float = 0.0
    top: list[tuple[int, float]] = []
    timings: Timings | None = None


class ProgressEvent(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Prompt processing so far (llama.cpp's `prompt_progress`), only for `return_progress` requests: one
    before evaluation starts (`processed == cache`), then one per evaluated chunk (the last one has
    `processed == total`). `timings` (prompt part only) when the request asked for `timings_per_token`."""

    total: int  # prompt tokens
    cache: int  # of those, reused from the cache
    processed: int  # in the cache now (reused + evaluated)
    time_ms: int  # since the request took its slot
    timings: Timings | None = None


class FinalEvent(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """The last event of a request."""

    reason: StopReason
    usage: Usage
    timings: Timings
    text: str = ""  # text held back until the end (flushed UTF-8, a partial stop-string prefix)
    stop_word: str = ""
    error: str = ""
    slot: int = -1
    truncated: bool = False  # the context shifted, or generation stopped at the context's end
