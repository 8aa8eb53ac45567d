"""Prompt shapes of the native endpoints and embeddings (endpoints.md §2.2) turned into token ids, and the
limits on how much text one request may ask to tokenize.

The limits apply to the whole request before any tokenizing: all prompts of a batch together, every
string of a mixed list. The tokenizer is pure Python; a long run of one character tokenizes at about
75,000 characters a second, so without a total a batch of 64 legal prompts could hold a worker for minutes.
Tokenizing runs in the state's worker pool (`ServerState.offload`), one prompt per call, so the event loop
keeps serving and a request that is given up stops between prompts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llama_engine.tokenizer import Tokenizer

from .errors import ApiError

if TYPE_CHECKING:
    from .state import ServerState

__all__ = [
    "INLINE_CHARS",
    "MAX_PROMPTS",
    "MAX_REQUEST_CHARS",
    "MAX_TEXT_PIECES",
    "check_request_chars",
    "check_request_text",
    "check_text_size",
    "encode",
    "max_piece_chars",
    "text_size",
    "tokenize_mixed",
    "tokenize_request",
]

MAX_PROMPTS = 64
MAX_REQUEST_CHARS = 1 << 20  # characters of text one request may ask to tokenize, all of it together
MAX_TEXT_PIECES = 4096  # separate strings one request may ask to tokenize (each call has its own cost)
# Text this short is tokenized on the event loop: it takes less time than handing it to a worker thread.
INLINE_CHARS = 256
_MAX_PIECE: dict[int, int] = {}


def max_piece_chars(tok: Tokenizer) -> int:
    """The longest text one token can stand for (computed once per tokenizer)."""
    key = id(tok)
    if key not in _MAX_PIECE:
        _MAX_PIECE[key] = max(1, max(len(tok.token_to_piece(i, True)) for i in range(tok.n_vocab)))
    return _MAX_PIECE[key]


def text_size(value: Any) -> tuple[int, int]:
    """(characters, strings) of all the text in a decoded JSON value (walked without recursion, so a
    deeply nested value cannot exhaust the stack)."""
    chars = pieces = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            chars += len(v)
            pieces += 1
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return chars, pieces


def check_request_chars(chars: int, what: str = "the request") -> None:
    """Refuse a request whose text, all of it together, is longer than `MAX_REQUEST_CHARS`."""
    if chars > MAX_REQUEST_CHARS:
        raise ApiError(
            f"{what} holds {chars} characters of text; at most {MAX_REQUEST_CHARS} are allowed per request"
        )


def check_request_text(value: Any, what: str = "the request") -> None:
    """Refuse a request whose text, all of it together, is over the per-request limits (characters, and
    strings tokenized one by one)."""
    chars, pieces = text_size(value)
    check_request_chars(chars, what)
    if pieces > MAX_TEXT_PIECES:
        raise ApiError(f"{what} holds {pieces} strings; at most {MAX_TEXT_PIECES} are allowed per request")


def check_text_size(n_chars: int, tok: Tokenizer, n_ctx: int | None) -> None:
    """Refuse text that cannot fit the slot context before spending time tokenizing it: every token covers
    at most `max_piece_chars` characters, so longer text has more tokens than the context holds."""
    if n_ctx is None:
        return
    lower = n_chars // max_piece_chars(tok)
    if lower >= n_ctx:
        raise ApiError(
            f"request ({lower} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it",
            "exceed_context_size_error",
            n_prompt_tokens=lower,
            n_ctx=n_ctx,
        )


def tokenize_mixed(
    item: list[Any], tok: Tokenizer, parse_special: bool = True, add_special: bool = True
) -> list[int]:
    """One prompt given as ids and strings mixed; BOS only if the first element is a string."""
    out: list[int] = []
    for i, part in enumerate(item):
        if isinstance(part, bool):
            raise ApiError("prompt elements must be token ids or strings")
        if isinstance(part, int):
            out.append(part)
        elif isinstance(part, str):
            out.extend(tok.encode(part, add_special=add_special and i == 0, parse_special=parse_special))
        else:
            raise ApiError("prompt elements must be token ids or strings")
    return out


def _one(item: Any, tok: Tokenizer) -> list[int]:
    if isinstance(item, str):
        return tok.encode(item, add_special=True, parse_special=True)
    if isinstance(item, list):
        return tokenize_mixed(item, tok)
    if isinstance(item, dict):
        if set(item) - {"prompt_string", "multimodal_data"}:
            raise ApiError(
                f"unknown keys in prompt object: {sorted(set(item) - {'prompt_string', 'multimodal_data'})}"
            )
        if item.get("multimodal_data"):
            raise ApiError("multimodal data is not supported: this server has no multimodal projector")
        text = item.get("prompt_string")
        if not isinstance(text, str):
            raise ApiError('"prompt_string" must be a string')
        return tok.encode(text, add_special=True, parse_special=True)
    raise ApiError("prompt must be a string, a list of tokens, or a list of prompts")


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _prompt_items(prompt: Any, field: str, tok: Tokenizer, n_ctx: int | None) -> list[Any]:
    """The request's prompts (an array containing a bare integer is one prompt), after every check that
    needs no tokenizing: the shape, the count, the whole request's text, each prompt against the context."""
    if prompt is None:
        raise ApiError(f'"{field}" must be provided')
    if isinstance(prompt, list) and not prompt:
        raise ApiError(f'"{field}" must not be empty')
    items = prompt if isinstance(prompt, list) and not any(_is_id(x) for x in prompt) else [prompt]
    if len(items) > MAX_PROMPTS:
        raise ApiError(f"at most {MAX_PROMPTS} prompts per request")
    check_request_text(prompt, f'"{field}"')
    for item in items:
        check_text_size(text_size(item)[0], tok, n_ctx)
    return items


async def tokenize_request(state: ServerState, prompt: Any, field: str = "prompt") -> list[list[int]]:
    """Every prompt in the request, tokenized off the event loop after the request-wide limits."""
    engine = state.require_engine()
    tok = engine.tokenizer
    out = []
    for item in _prompt_items(prompt, field, tok, engine.n_ctx_slot):
        if text_size(item)[0] <= INLINE_CHARS:
            out.append(_one(item, tok))
        else:
            out.append(await state.offload(_one, item, tok))
    return out


async def encode(state: ServerState, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
    """One text tokenized off the event loop (the caller has checked its size)."""
    tok = state.require_engine().tokenizer
    if len(text) <= INLINE_CHARS:
        return tok.encode(text, add_special=add_special, parse_special=parse_special)
    return await state.offload(tok.encode, text, add_special=add_special, parse_special=parse_special)
