"""POST /completion, /completions (native) and /v1/completions (OpenAI legacy), and /infill."""

from __future__ import annotations

from litestar import Controller, Request, Response, post
from litestar.params import JSONBody

from llama_engine.tokenizer import Tokenizer

from ..errors import ApiError
from ..formats import CompletionsFormatter, NativeFormatter
from ..formats.verbose import verbose_for
from ..generation import completion_id
from ..infill import infill_prompt
from ..params import build_requests
from ..prompts import tokenize_request
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
        special=server.config.special,
        return_tokens=bool(body.return_tokens),
        response_fields=body.response_fields,
    )
    return await respond(request, server, reqs, fmt, body)


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
            special=server.config.special,
            verbose=verbose_for(data, server.config, tok, reqs, server.model_name, _n_probs(data)),
        )
        return await respond(request, server, reqs, fmt, data)

    @post("/infill", status_code=200)
    async def infill(self, request: Request, server: SharedState, data: JSONBody[InfillBody]) -> Response:
        _check_fim(server.require_engine().tokenizer)
        prompt = await unless_disconnected(request, infill_prompt(server, data))
        return await _native(request, server, data, [prompt])
