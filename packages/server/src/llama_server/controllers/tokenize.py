"""POST /tokenize and /detokenize."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, post

from ..errors import ApiError
from ..prompts import tokenize_mixed
from ._common import json_response, read_body, server_state

__all__ = ["TokenizeController"]


class TokenizeBody(msgspec.Struct, kw_only=True):
    content: str | Annotated[list[int | str], msgspec.Meta(max_length=1 << 20)] | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(msgspec.Struct, kw_only=True):
    tokens: Annotated[list[int], msgspec.Meta(max_length=1 << 20)] | None = None


class TokenizeController(Controller):
    @post("/tokenize", status_code=200)
    async def tokenize(self, request: Request) -> Response:
        body: TokenizeBody = await read_body(request, TokenizeBody)
        tok = server_state(request).require_engine().tokenizer
        if body.content is None:
            return json_response({"tokens": []})
        content = body.content
        if isinstance(content, str):
            # long text is tokenized off the event loop, so other requests (and /health) keep being served
            encode = partial(
                tok.encode, content, add_special=body.add_special, parse_special=body.parse_special
            )
            ids = await asyncio.to_thread(encode) if len(content) > 65536 else encode()
        else:
            ids = tokenize_mixed(content, tok, body.parse_special, body.add_special)
        if not body.with_pieces:
            return json_response({"tokens": ids})
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
        return json_response({"tokens": out})

    @post("/detokenize", status_code=200)
    async def detokenize(self, request: Request) -> Response:
        body: DetokenizeBody = await read_body(request, DetokenizeBody)
        tok = server_state(request).require_engine().tokenizer
        ids = body.tokens or []
        if any(not 0 <= t < tok.n_vocab for t in ids):
            raise ApiError(f"token ids must lie in 0..{tok.n_vocab - 1}")
        return json_response({"content": tok.decode(ids)})
