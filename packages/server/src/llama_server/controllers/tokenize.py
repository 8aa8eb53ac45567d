"""POST /tokenize and /detokenize."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, post
from litestar.params import JSONBody

from llama_engine.tokenizer import Tokenizer

from ..errors import ApiError
from ..prompts import INLINE_CHARS, check_request_text, tokenize_mixed
from ..schemas import DetokenizeBody, TokenizeBody
from ._common import SharedState, json_response, unless_disconnected

__all__ = ["TokenizeController"]


def _tokenize(tok: Tokenizer, body: TokenizeBody) -> list[int]:
    content = body.content
    if isinstance(content, str):
        return tok.encode(content, add_special=body.add_special, parse_special=body.parse_special)
    return tokenize_mixed(content or [], tok, body.parse_special, body.add_special)


def _pieces(tok: Tokenizer, ids: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in ids:
        if not 0 <= t < tok.n_vocab:
            raise ApiError(f"token id {t} is outside the vocabulary")
        raw = tok.token_to_piece(t, special=True)
        try:
            piece: str | list[int] = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        out.append({"id": t, "piece": piece})
    return out


class TokenizeController(Controller):
    @post("/tokenize", status_code=200)
    async def tokenize(self, request: Request, server: SharedState, data: JSONBody[TokenizeBody]) -> Response:
        tok = server.require_engine().tokenizer
        if data.content is None:
            return json_response({"tokens": []})
        check_request_text(data.content, '"content"')
        if isinstance(data.content, str) and len(data.content) <= INLINE_CHARS:
            ids = _tokenize(tok, data)
        else:
            ids = await unless_disconnected(request, server.offload(_tokenize, tok, data))
        return json_response({"tokens": _pieces(tok, ids) if data.with_pieces else ids})

    @post("/detokenize", status_code=200)
    async def detokenize(self, server: SharedState, data: JSONBody[DetokenizeBody]) -> Response:
        tok = server.require_engine().tokenizer
        ids = data.tokens or []
        if any(not 0 <= t < tok.n_vocab for t in ids):
            raise ApiError(f"token ids must lie in 0..{tok.n_vocab - 1}")
        text = tok.decode(ids) if len(ids) <= INLINE_CHARS else await server.offload(tok.decode, ids)
        return json_response({"content": text})
