"""POST /rerank (and /reranking, /v1/rerank, /v1/reranking): a query scored against documents, with
`--reranking` (embeddings with rank pooling), as llama-server answers it (endpoints.md §14).

Jina/Cohere form by default; the TEI form when the body has `texts`. Each (query, document) pair is one
rank-pooled evaluation whose label-0 score is the relevance. Fields of the wrong type fall back to their
defaults as llama-server's do (`documents` falls back to `texts`, `top_n` to every document).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import numpy as np
from litestar import Controller, Request, Response, post

from llama_engine import EmbeddingHandle, EmbeddingRequest, Pooling
from llama_engine.rerank import rerank_prompt

from ..bridge import until_disconnect
from ..errors import ApiError
from ..lora import global_scales
from ..prompts import INLINE_CHARS, MAX_TEXT_PIECES, check_request_chars, check_text_size
from ..state import ServerState
from ._common import SharedState, json_response

__all__ = ["RERANK_PATHS", "RerankController", "rerank_enabled"]

RERANK_PATHS = ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"]


def rerank_enabled(st: ServerState) -> bool:
    """llama-server's condition: embeddings on with rank pooling (`--reranking` sets both)."""
    return st.config.embeddings and st.config.pooling == "rank"


class _Handles:
    """Every pair's engine request, cancelled together when the client goes away."""

    def __init__(self, handles: list[EmbeddingHandle]) -> None:
        self.handles = handles

    def cancel(self) -> None:
        for h in self.handles:
            h.cancel()


def _string_list(v: Any) -> list[str] | None:
    return v if isinstance(v, list) and all(isinstance(s, str) for s in v) else None


def _top_n(v: Any, default: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return default
    if v < 0:
        raise ApiError('"top_n" must be a non-negative integer')
    return int(v)


def _parse(body: Any) -> tuple[str, list[str], int, bool]:
    """(query, documents, top_n, tei) from the body, with llama-server's checks and messages."""
    if not isinstance(body, dict):
        raise ApiError("Request body must be a JSON object")
    if "query" not in body:
        raise ApiError('"query" must be provided')
    query = body["query"]
    if not isinstance(query, str):
        raise ApiError('"query" must be a string')
    docs = _string_list(body.get("documents"))
    if docs is None:
        docs = _string_list(body.get("texts"))
    if not docs:
        raise ApiError('"documents" must be a non-empty string array')
    if len(docs) > MAX_TEXT_PIECES:
        raise ApiError(f"the request holds {len(docs)} documents; at most {MAX_TEXT_PIECES} are allowed")
    check_request_chars(len(query) * len(docs) + sum(len(d) for d in docs))
    return query, docs, _top_n(body.get("top_n"), len(docs)), "texts" in body


async def _prompts(st: ServerState, query: str, docs: list[str]) -> list[list[int]]:
    """Each pair's token ids (format_prompt_rerank), checked against the slot context."""
    engine = st.require_engine()
    tok, n_ctx = engine.tokenizer, engine.n_ctx_slot
    template = engine.gguf.tokenizer.chat_templates.get("rerank")
    out = []
    for doc in docs:
        check_text_size(len(query) + len(doc) + len(template or ""), tok, n_ctx)
        if len(query) + len(doc) <= INLINE_CHARS:
            ids = rerank_prompt(tok, template, query, doc)
        else:
            ids = await st.offload(rerank_prompt, tok, template, query, doc)
        if not ids:
            raise ApiError("Input content cannot be empty")
        if len(ids) > n_ctx:
            raise ApiError(
                f"request ({len(ids)} tokens) exceeds the available context size ({n_ctx} tokens), "
                "try increasing it",
                "exceed_context_size_error",
                n_prompt_tokens=len(ids),
                n_ctx=n_ctx,
            )
        out.append(ids)
    return out


async def _scores(request: Request, st: ServerState, prompts: list[list[int]]) -> list[float]:
    engine = st.require_engine()
    lora = tuple(global_scales(st))
    handles = [
        engine.submit_embedding(EmbeddingRequest(prompt=p, pooling=Pooling.RANK, normalize=-1, lora=lora))
        for p in prompts
    ]

    async def wait_all() -> list[np.ndarray]:
        return [await asyncio.to_thread(h.result) for h in handles]

    vectors = await until_disconnect(request.receive, wait_all(), _Handles(handles))
    return [float(v[0]) for v in vectors]


def _format(
    body: dict[str, Any],
    st: ServerState,
    docs: list[str],
    scores: list[float],
    n_tokens: int,
    top_n: int,
    tei: bool,
) -> Any:
    """llama-server's format_response_rerank: sorted by score (stable), cut to top_n."""
    label = "score" if tei else "relevance_score"
    return_text = tei and body.get("return_text") is True
    results: list[dict[str, Any]] = []
    for i, s in enumerate(scores):
        item: dict[str, Any] = {"index": i, label: s}
        if return_text:
            item["text"] = docs[i]
        results.append(item)
    results.sort(key=lambda r: -r[label])
    results = results[:top_n]
    if tei:
        return results
    model = body.get("model")
    return {
        "model": model if isinstance(model, str) else st.model_name,
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "results": results,
    }


class RerankController(Controller):
    @post(RERANK_PATHS, status_code=200)
    async def rerank(self, request: Request, server: SharedState) -> Response:
        if not rerank_enabled(server):
            raise ApiError(
                "This server does not support reranking. Start it with `--reranking`", "not_supported_error"
            )
        try:
            body = msgspec.json.decode(await request.body())
        except msgspec.DecodeError:
            raise ApiError("Invalid JSON body") from None
        query, docs, top_n, tei = _parse(body)
        prompts = await _prompts(server, query, docs)
        scores = await _scores(request, server, prompts)
        n_tokens = sum(len(p) for p in prompts)
        server.metrics.prompt_tokens_total += n_tokens
        return json_response(_format(body, server, docs, scores, n_tokens, top_n, tei))
