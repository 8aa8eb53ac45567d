"""Prompt shapes of the native endpoints and embeddings (endpoints.md §2.2) turned into token ids."""

from __future__ import annotations

from typing import Any

from llama_engine.tokenizer import Tokenizer

from .errors import ApiError

__all__ = ["MAX_PROMPTS", "check_text_size", "tokenize_mixed", "tokenize_prompts"]

MAX_PROMPTS = 64
_MAX_PIECE: dict[int, int] = {}


def max_piece_chars(tok: Tokenizer) -> int:
    """The longest text one token can stand for (computed once per tokenizer)."""
    key = id(tok)
    if key not in _MAX_PIECE:
        _MAX_PIECE[key] = max(1, max(len(tok.token_to_piece(i, True)) for i in range(tok.n_vocab)))
    return _MAX_PIECE[key]


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


def _total_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_total_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(_total_chars(v) for v in value.values())
    return 0


def tokenize_prompts(
    prompt: Any, tok: Tokenizer, field: str = "prompt", n_ctx: int | None = None
) -> list[list[int]]:
    """Every prompt in the request, tokenized. An array containing a bare integer is one prompt.
    With `n_ctx`, text too long to fit is refused before tokenizing."""
    if isinstance(prompt, list) and len(prompt) > MAX_PROMPTS and not any(isinstance(x, int) for x in prompt):
        raise ApiError(f"at most {MAX_PROMPTS} prompts per request")
    if isinstance(prompt, list) and any(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
        check_text_size(_total_chars(prompt), tok, n_ctx)
    elif isinstance(prompt, list):
        for item in prompt:
            check_text_size(_total_chars(item), tok, n_ctx)
    else:
        check_text_size(_total_chars(prompt), tok, n_ctx)
    if prompt is None:
        raise ApiError(f'"{field}" must be provided')
    if isinstance(prompt, list):
        if not prompt:
            raise ApiError(f'"{field}" must not be empty')
        if any(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return [tokenize_mixed(prompt, tok)]
        if len(prompt) > MAX_PROMPTS:
            raise ApiError(f"at most {MAX_PROMPTS} prompts per request")
        return [_one(x, tok) for x in prompt]
    return [_one(prompt, tok)]
