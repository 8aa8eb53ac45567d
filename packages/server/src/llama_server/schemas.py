"""Every request body the server accepts, as msgspec Structs (handlers take them as Litestar `data:`).

Types and strict ranges are declared here, so a wrong type, a number out of range, NaN or a huge number is
a 400 before anything reaches the engine. `null` means "use the server default". Litestar decodes these
bodies (its conversion is not strict: a number given as a numeric string, `"5"`, is accepted, as the
reference's JSON reader does); app.py turns its validation errors into the JSON error shape.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from llama_engine.sampling import MAX_N_PROBS

from .config import ServerConfig
from .errors import ApiError

__all__ = [
    "INT32_MAX",
    "MAX_BIAS",
    "MAX_BIAS_ENTRIES",
    "MAX_BIAS_TEXT_CHARS",
    "MAX_MESSAGES",
    "AnthropicBody",
    "ChatBody",
    "CompletionBody",
    "ContentPart",
    "DetokenizeBody",
    "EmbeddingBody",
    "Float",
    "GenParams",
    "GrammarTriggerBody",
    "InfillBody",
    "InfillExtra",
    "Int32",
    "Message",
    "NPredict",
    "NProbs",
    "NonNeg",
    "ResponseFormat",
    "ResponsesBody",
    "Seed",
    "SlotFileBody",
    "Stop",
    "StreamOptions",
    "TokenizeBody",
    "bias_pairs",
    "bias_text_keys",
    "check_bias_values",
    "token_id",
]

INT32_MAX = 2**31 - 1
MAX_MESSAGES = 4096
MAX_BIAS_ENTRIES = 4096
MAX_BIAS = 1e30  # a logit_bias value's magnitude, as the float fields: it must stay finite in float32
# characters of all the text keys of one logit_bias together (each key is tokenized)
MAX_BIAS_TEXT_CHARS = 1 << 16
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=INT32_MAX)]
NPredict = Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]
NonNeg = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
MinusOneUp = Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]
Seed = Annotated[int, msgspec.Meta(ge=-1, le=0xFFFFFFFF)]
NProbs = Annotated[int, msgspec.Meta(ge=0, le=MAX_N_PROBS)]
Float = Annotated[float, msgspec.Meta(ge=-1e30, le=1e30)]  # finite and sane
Stop = Annotated[str, msgspec.Meta(max_length=4096)]
NChoices = Annotated[int, msgspec.Meta(ge=1, le=64)]
ShortList = Annotated[list[str], msgspec.Meta(max_length=64)]
SamplerNames = Annotated[list[Annotated[str, msgspec.Meta(max_length=32)]], msgspec.Meta(max_length=64)]
LogitBias = (
    Annotated[list[Any], msgspec.Meta(max_length=MAX_BIAS_ENTRIES)]
    | Annotated[dict[str, float | bool], msgspec.Meta(max_length=MAX_BIAS_ENTRIES)]
)


def bias_pairs(value: Any) -> list[tuple[Any, Any]]:
    """logit_bias's two forms, llama.cpp's: [[token|text, bias|false], ...] or {"token|text": bias};
    malformed entries are skipped."""
    if isinstance(value, dict):
        return list(value.items())
    return [tuple(e) for e in value if isinstance(e, list) and len(e) == 2]


def token_id(key: Any) -> int | None:
    """A logit_bias key as a token id (an integer, or a string of one), else None (text)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str):
        try:
            return int(key)
        except ValueError:
            return None
    return None


def check_bias_values(value: Any) -> None:
    """ValueError for a logit_bias value (a number; `false` bans and other values are skipped, as
    llama.cpp does) that is not finite or whose magnitude exceeds MAX_BIAS."""
    if isinstance(value, dict):
        named = [(f"key {k[:64]!r}", b) for k, b in value.items()]
    else:
        named = [(f"entry {i}", e[1]) for i, e in enumerate(value) if isinstance(e, list) and len(e) == 2]
    for where, bias in named:
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            continue
        if abs(bias) <= MAX_BIAS:  # False for NaN; ints of any size compare exactly
            continue
        try:
            shown = f"{bias:.6g}"
        except OverflowError:  # an integer beyond float range
            shown = f"of {len(str(abs(bias)))} digits"
        raise ValueError(
            f"logit_bias {where}: bias {shown} is out of range; a bias must be finite and within "
            f"-{MAX_BIAS:g} .. {MAX_BIAS:g} (false bans a token)"
        )


def bias_text_keys(value: Any) -> list[str]:
    """The keys of a logit_bias that are text to tokenize."""
    return [k for k, _ in bias_pairs(value) if isinstance(k, str) and token_id(k) is None]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class GrammarTriggerBody(msgspec.Struct, kw_only=True):
    """One of `grammar_triggers`: type 0 token, 1 word, 2 pattern, 3 pattern_full."""

    type: Annotated[int, msgspec.Meta(ge=0, le=3)]
    value: Annotated[str, msgspec.Meta(max_length=4096)] = ""
    token: Int32 | None = None


class GenParams(msgspec.Struct, kw_only=True):
    """The generation fields (endpoints.md §2.1) shared by /completion, /v1/completions and chat."""

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
    repeat_last_n: MinusOneUp | None = None
    presence_penalty: Float | None = None
    frequency_penalty: Float | None = None
    dry_multiplier: Float | None = None
    dry_base: Float | None = None
    dry_allowed_length: NonNeg | None = None
    dry_penalty_last_n: MinusOneUp | None = None
    dry_sequence_breakers: Annotated[list[Stop], msgspec.Meta(min_length=1, max_length=64)] | None = None
    mirostat: Int32 | None = None
    mirostat_tau: Float | None = None
    mirostat_eta: Float | None = None
    seed: Seed | None = None
    n_keep: MinusOneUp | None = None
    n_discard: NonNeg | None = None
    n_indent: NonNeg | None = None
    n_cmpl: NChoices | None = None
    n: NChoices | None = None
    n_cache_reuse: NonNeg | None = None
    priority: Int32 | None = None  # with --scheduling-policy priority: lower is served first (vLLM's)
    t_max_predict_ms: MinusOneUp | None = None
    stop: Stop | Annotated[list[Stop], msgspec.Meta(max_length=64)] | None = None
    ignore_eos: bool | None = None
    logit_bias: LogitBias | None = None
    n_probs: NProbs | None = None
    post_sampling_probs: bool | None = None
    min_keep: NonNeg | None = None
    samplers: SamplerNames | str | None = None
    grammar: str | None = None
    json_schema: Any = None
    grammar_lazy: bool | None = None
    grammar_triggers: Annotated[list[GrammarTriggerBody], msgspec.Meta(max_length=256)] | None = None
    preserved_tokens: (
        Annotated[list[Annotated[str, msgspec.Meta(max_length=256)]], msgspec.Meta(max_length=1024)] | None
    ) = None
    cache_prompt: bool | None = None
    id_slot: MinusOneUp | None = None
    return_tokens: bool | None = None
    return_progress: bool | None = None
    timings_per_token: bool | None = None
    sse_ping_interval: MinusOneUp | None = None
    response_fields: ShortList | None = None
    reasoning_format: str | None = None
    verbose: bool | None = None
    model: str | None = None
    lora: Any = None  # [{"id", "scale"}]: this request's LoRA scales (llama_server.lora)

    def __post_init__(self) -> None:
        # checked as the body is decoded, so a request is refused before any of its text is tokenized
        if self.logit_bias is not None:
            check_bias_values(self.logit_bias)
            n = sum(len(k) for k in bias_text_keys(self.logit_bias))
            if n > MAX_BIAS_TEXT_CHARS:
                raise ValueError(
                    f"logit_bias text keys hold {n} characters together; at most {MAX_BIAS_TEXT_CHARS} "
                    "are allowed"
                )

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


# -- native and OpenAI text completion -------------------------------------------------------------------


class CompletionBody(GenParams, kw_only=True):
    prompt: Any = None
    logprobs: NProbs | None = None  # OpenAI name of n_probs
    echo: bool | None = None
    suffix: str | None = None


class InfillExtra(msgspec.Struct, kw_only=True):
    text: str
    filename: str | None = None


class InfillBody(CompletionBody, kw_only=True):
    input_prefix: str | list[Any] | None = None
    input_suffix: str | list[Any] | None = None
    input_extra: Annotated[list[InfillExtra], msgspec.Meta(max_length=256)] | None = None


# -- chat --------------------------------------------------------------------------------------------------


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    input_video: Any = None
    video_url: Any = None


class Message(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: Annotated[str, msgspec.Meta(max_length=64)]
    content: str | Annotated[list[ContentPart], msgspec.Meta(max_length=256)] | None = None
    tool_calls: Annotated[list[Any], msgspec.Meta(max_length=256)] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: str
    json_schema: Any = None
    schema: Any = None


class ChatBody(GenParams, kw_only=True):
    messages: Annotated[list[Message], msgspec.Meta(max_length=MAX_MESSAGES)] | None = None
    tools: Annotated[list[Any], msgspec.Meta(max_length=512)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: NProbs | None = None
    reasoning_budget_tokens: MinusOneUp | None = None  # llama_server.reasoning_budget
    thinking_budget_tokens: MinusOneUp | None = None
    reasoning_budget_message: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    reasoning_control: bool | None = None  # /v1/chat/completions/control may end the thinking (control.py)


class AnthropicBody(msgspec.Struct, kw_only=True):
    messages: Annotated[list[Any], msgspec.Meta(max_length=MAX_MESSAGES)] | None = None
    system: str | Annotated[list[Any], msgspec.Meta(max_length=256)] | None = None
    model: str | None = None
    max_tokens: NPredict | None = None
    stop_sequences: Annotated[list[Stop], msgspec.Meta(max_length=64)] | None = None
    temperature: Float | None = None
    top_p: Float | None = None
    top_k: Int32 | None = None
    stream: bool | None = None
    tools: Annotated[list[Any], msgspec.Meta(max_length=512)] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class ResponsesBody(msgspec.Struct, kw_only=True):
    input: str | Annotated[list[Any], msgspec.Meta(max_length=MAX_MESSAGES)] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: Annotated[list[Any], msgspec.Meta(max_length=512)] | None = None
    max_output_tokens: NPredict | None = None
    reasoning: dict[str, Any] | None = None


# -- tokens, embeddings, slots -----------------------------------------------------------------------------


class TokenizeBody(msgspec.Struct, kw_only=True):
    content: str | Annotated[list[int | str], msgspec.Meta(max_length=1 << 20)] | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(msgspec.Struct, kw_only=True):
    tokens: Annotated[list[int], msgspec.Meta(max_length=1 << 20)] | None = None


class EmbeddingBody(msgspec.Struct, kw_only=True):
    input: Any = None
    content: Any = None
    encoding_format: str | None = None
    embd_normalize: int | None = None
    model: str | None = None


class SlotFileBody(msgspec.Struct, kw_only=True):
    filename: str | None = None
