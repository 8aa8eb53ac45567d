"""POST /completion, /completions (native) and /v1/completions (OpenAI legacy), and /infill."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, post
from litestar.params import JSONBody

from llama_engine.tokenizer import Tokenizer

from ..errors import ApiError
from ..formats import CompletionsFormatter, NativeFormatter
from ..formats.verbose import verbose_for
from ..generation import completion_id
from ..params import build_requests
from ..prompts import check_text_size, encode, tokenize_mixed, tokenize_request
from ..schemas import CompletionBody, InfillBody
from ..state import ServerState
from ..streaming import respond
from ._common import SharedState, generation_settings, now, unless_disconnected

__all__ = ["CompletionController"]


def _n_probs(body: CompletionBody) -> int:
    return body.n_probs if body.n_probs is not None else (body.logprobs or 0)


async def _native(
    request: Request, server: ServerState, body: CompletionBody, prompts: list[list[int]]
) -> Response:
    tok = server.require_engine().tokenizer
    reqs = await unless_disconnected(request, build_requests(server, body, prompts, _n_probs(body)))
    settings = [generation_settings(r, bool(body.stream), eog_ids=tok.eog_ids) for r in reqs]
    fmt = NativeFormatter(
        tok,
        reqs,
        settings,
        server.model_name,
        n_probs=_n_probs(body),
        post=bool(body.post_sampling_probs),
        return_tokens=bool(body.return_tokens),
        response_fields=body.response_fields,
    )
    return await respond(request, server, reqs, fmt, body)


async def _infill_prompt(request: Request, server: ServerState, body: InfillBody) -> list[int]:
    """llama.cpp's FIM layout: `[extra][BOS?][PRE]prefix prompt[SUF]suffix[MID]` (endpoints.md §15)."""
    tok = server.require_engine().tokenizer
    if body.input_prefix is None or body.input_suffix is None:
        raise ApiError('"input_prefix" and "input_suffix" are required')
    pieces = (body.input_prefix, body.input_suffix)
    check_text_size(
        sum(len(x) for x in pieces if isinstance(x, str)), tok, server.require_engine().n_ctx_slot
    )

    async def enc(v: str | list[Any], special: bool = False) -> list[int]:
        if isinstance(v, str):
            return await encode(server, v, add_special=False, parse_special=special)
        return tokenize_mixed(v, tok, parse_special=False, add_special=False)

    n_batch = server.config.n_batch
    prefix = (await enc(body.input_prefix))[-(3 * (n_batch // 4)) :]
    extra = await enc(body.prompt, special=True) if isinstance(body.prompt, str) else []
    suffix = (await enc(body.input_suffix))[: max(0, n_batch // 4 - 2 - len(extra))]
    ctx: list[int] = []
    for chunk in body.input_extra or []:
        ctx += await enc("\n\n--- snippet ---\n\n" + chunk.text)
    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    fim = tok.fim_ids
    if server.config.spm_infill:  # --spm-infill: suffix, then prefix (the order some models were trained on)
        return [*ctx, *bos, fim["suf"], *suffix, fim["pre"], *prefix, *extra, fim["mid"]]  # type: ignore[list-item]
    return [*ctx, *bos, fim["pre"], *prefix, *extra, fim["suf"], *suffix, fim["mid"]]  # type: ignore[list-item]


def _check_fim(tok: Tokenizer) -> None:
    for key, name in (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle")):
        if tok.fim_ids[key] is None:
            raise ApiError(
                f"Infill is not supported by this model: {name} token is missing. ", "not_supported_error"
            )


class CompletionController(Controller):
    """Text completion: llama.cpp's native format and OpenAI's legacy `text_completion`."""

    @post(["/completion", "/completions"], status_code=200)
    async def native(self, request: Request, server: SharedState, data: JSONBody[CompletionBody]) -> Response:
        prompts = await unless_disconnected(request, tokenize_request(server, data.prompt))
        return await _native(request, server, data, prompts)

    @post("/v1/completions", status_code=200)
    async def openai(self, request: Request, server: SharedState, data: JSONBody[CompletionBody]) -> Response:
        if data.prompt is None:
            raise ApiError('"prompt" must be provided')
        prompts = await unless_disconnected(request, tokenize_request(server, data.prompt))
        reqs = await unless_disconnected(request, build_requests(server, data, prompts, _n_probs(data)))
        tok = server.require_engine().tokenizer
        fmt = CompletionsFormatter(
            tok,
            id=completion_id(),
            created=now(),
            model=server.model_name,
            n_probs=_n_probs(data),
            post=bool(data.post_sampling_probs),
            verbose=verbose_for(data, server.config, tok, reqs, server.model_name, _n_probs(data)),
        )
        return await respond(request, server, reqs, fmt, data)

    @post("/infill", status_code=200)
    async def infill(self, request: Request, server: SharedState, data: JSONBody[InfillBody]) -> Response:
        _check_fim(server.require_engine().tokenizer)
        prompt = await _infill_prompt(request, server, data)
        return await _native(request, server, data, [prompt])
