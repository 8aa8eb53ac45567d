"""POST /v1/embeddings (OpenAI) and /embedding, /embeddings (native), with --embeddings."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import msgspec
import numpy as np
from litestar import Controller, Request, Response, post
from litestar.params import JSONBody

from llama_engine import EmbeddingRequest, Pooling

from ..bridge import until_disconnect
from ..chat_prompt import media_not_supported
from ..errors import ApiError
from ..pooling import server_pooling
from ..prompts import tokenize_request
from ..schemas import EmbeddingBody
from ..sse import encode
from ..state import ServerState
from ._common import SharedState, json_response_off_loop, unless_disconnected

__all__ = ["EmbeddingsController"]


_SHAPES = (
    '"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt string, or a list '
    "of mixed strings & tokens."
)


def _flatten_content(item: Any) -> Any:
    """`{"content": [parts]}` inputs become their text parts joined without separator; as llama.cpp, a
    `content` that is not a list of parts, an unknown part type and media parts (no projector) are 400s."""
    if isinstance(item, dict) and "content" in item:
        parts = item["content"]
        if not isinstance(parts, list):
            raise ApiError(_SHAPES)
        texts = []
        for p in parts:
            kind = p.get("type") if isinstance(p, dict) else None
            if kind in ("image_url", "input_audio", "input_video"):
                raise media_not_supported(kind)
            if kind != "text":
                raise ApiError("unsupported content[].type")
            if not isinstance(p.get("text"), str):
                raise ApiError("text parts need a 'text' string")
            texts.append(p["text"])
        return "".join(texts)
    return item


class EmbeddingsController(Controller):
    async def _embed(
        self, request: Request, st: ServerState, body: EmbeddingBody, field: str
    ) -> tuple[list[np.ndarray], int, Pooling]:
        if not st.config.embeddings:
            raise ApiError(
                "This server does not support embeddings. Start it with `--embeddings`", "not_supported_error"
            )
        engine = st.require_engine()
        value = body.input if body.input is not None else body.content
        if value is None:
            raise ApiError('"input" or "content" must be provided')
        if isinstance(value, bool) or not isinstance(value, str | list | dict):
            raise ApiError(f'"{field}" must be a string, a list of tokens, or a list of inputs')
        value = [_flatten_content(v) for v in value] if isinstance(value, list) else _flatten_content(value)
        prompts = await unless_disconnected(request, tokenize_request(st, value, field))
        pooling = server_pooling(st)
        normalize = body.embd_normalize if body.embd_normalize is not None else st.config.embd_normalize
        if not -1 <= normalize <= 64:
            raise ApiError("embd_normalize must be between -1 and 64")
        n_ctx, n_vocab = engine.n_ctx_slot, engine.tokenizer.n_vocab
        for p in prompts:
            if not p:
                raise ApiError("Input content cannot be empty")
            if len(p) > n_ctx:
                raise ApiError(
                    f"input ({len(p)} tokens) is too large to process. increase the physical batch size "
                    f"(current batch size: {n_ctx})",
                    "server_error",
                )
            if min(p) < 0 or max(p) >= n_vocab:
                raise ApiError("Input contains invalid tokens")
        out = []
        for p in prompts:
            req = EmbeddingRequest(prompt=p, pooling=pooling, normalize=normalize)
            handle = engine.submit_embedding(req)
            # a client that goes away cancels the request (checked by the engine between batches)
            out.append(await until_disconnect(request.receive, asyncio.to_thread(handle.result), handle))
        n_tokens = sum(len(p) for p in prompts)
        st.metrics.prompt_tokens_total += n_tokens
        return out, n_tokens, pooling

    @post("/v1/embeddings", status_code=200)
    async def openai(self, request: Request, server: SharedState, data: JSONBody[EmbeddingBody]) -> Response:
        if data.input is None and data.content is not None:
            return await self._native(request, server, data)
        fmt = data.encoding_format or "float"
        if fmt not in ("float", "base64"):
            raise ApiError('encoding_format must be "float" or "base64"')
        if server.config.embeddings and server_pooling(server) == Pooling.NONE:
            raise ApiError("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
        vectors, n_tokens, _ = await self._embed(request, server, data, "input")
        model = data.model or server.model_name
        return await json_response_off_loop(
            lambda: {
                "model": model,
                "object": "list",
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
                "data": [_openai_item(i, v, fmt) for i, v in enumerate(vectors)],
            }
        )

    @post(["/embedding", "/embeddings"], status_code=200)
    async def native(self, request: Request, server: SharedState, data: JSONBody[EmbeddingBody]) -> Response:
        return await self._native(request, server, data)

    async def _native(self, request: Request, st: ServerState, body: EmbeddingBody) -> Response:
        field = "content" if body.input is None else "input"
        vectors, _, pooling = await self._embed(request, st, body, field)
        return await json_response_off_loop(lambda: _native_items(vectors, pooling))


def _native_items(vectors: list[np.ndarray], pooling: Pooling) -> list[dict[str, Any]]:
    """The native body: per input, every token's vector (pooling none) or the one pooled vector."""
    return [
        {"index": i, "embedding": [_vector(r) for r in v] if pooling == Pooling.NONE else [_vector(v)]}
        for i, v in enumerate(vectors)
    ]


def _vector(v: np.ndarray) -> msgspec.Raw:
    """One vector's JSON, encoded on its own: a body of many vectors is built in many short calls, each
    holding the GIL for tens of microseconds, so the event loop keeps running beside the worker thread."""
    return msgspec.Raw(encode(v.tolist()))


def _openai_item(index: int, v: np.ndarray, fmt: str) -> dict[str, Any]:
    if fmt == "base64":
        b64 = base64.b64encode(v.astype("<f4").tobytes()).decode()
        return {"embedding": b64, "index": index, "object": "embedding", "encoding_format": "base64"}
    return {"embedding": _vector(v), "index": index, "object": "embedding"}
