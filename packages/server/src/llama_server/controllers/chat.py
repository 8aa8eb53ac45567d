"""POST /v1/chat/completions (and /chat/completions), /apply-template and the input-token counter."""

from __future__ import annotations

from typing import NamedTuple

from litestar import Controller, Request, Response, post
from litestar.params import JSONBody

from llama_engine import GenerationRequest

from ..chat_prompt import render_chat
from ..errors import ApiError
from ..formats import ChatFormatter, Parsing
from ..formats.verbose import verbose_for
from ..generation import completion_id
from ..params import build_requests
from ..reasoning_budget import budget_params, with_budget
from ..schemas import ChatBody
from ..state import ServerState
from ..streaming import respond
from ._common import SharedState, json_response, now, unless_disconnected

__all__ = ["ChatController", "ChatJob", "prepare_chat"]

_REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


class ChatJob(NamedTuple):
    """A chat request after its prompt is rendered: the engine requests and how to parse their text."""

    reqs: list[GenerationRequest]
    parsing: Parsing
    n_prompt: int


def _n_probs(body: ChatBody) -> int:
    return (body.top_logprobs if body.top_logprobs is not None else 20) if body.logprobs else 0


async def prepare_chat(request: Request, server: ServerState, body: ChatBody) -> ChatJob:
    """Render and tokenize the prompt, build one engine request per choice (shared by every chat API)."""
    prompt = await unless_disconnected(request, render_chat(server, body))
    reqs = await unless_disconnected(request, build_requests(server, body, [prompt.tokens], _n_probs(body)))
    lazy = bool(reqs) and reqs[0].sampling.grammar_lazy
    budget = budget_params(body, server.config, server.require_engine().tokenizer, prompt, lazy)
    reqs = with_budget(reqs, budget)
    fmt = body.reasoning_format or server.config.reasoning_format
    if fmt not in _REASONING_FORMATS:
        raise ApiError(f"Unknown reasoning format: {fmt}", "server_error")
    tools = bool(body.tools) and body.tool_choice != "none"
    caps = server.template.caps if server.template is not None else None
    parsing = Parsing(
        fmt != "none",
        tools,
        prompt.thinking_open,
        fmt == "deepseek-legacy",
        prompt.think_tags,
        caps.chat_format if caps is not None else "generic",
        list(body.tools or []),
    )
    return ChatJob(reqs, parsing, len(prompt.tokens))


class ChatController(Controller):
    """OpenAI chat completions over the model's chat template."""

    @post(["/v1/chat/completions", "/chat/completions"], status_code=200)
    async def chat(self, request: Request, server: SharedState, data: JSONBody[ChatBody]) -> Response:
        job = await prepare_chat(request, server, data)
        tok = server.require_engine().tokenizer
        cmpl_id = completion_id()
        # the control route can end the thinking only of a request that asked for it and has a budget
        armed = bool(data.reasoning_control) and any(r.sampling.reasoning_budget for r in job.reqs)
        fmt = ChatFormatter(
            tok,
            job.parsing,
            len(job.reqs),
            id=cmpl_id,
            created=now(),
            model=server.model_name,
            n_probs=_n_probs(data),
            post=bool(data.post_sampling_probs),
            special=server.config.special,
            include_usage=bool(data.stream_options and data.stream_options.include_usage),
            verbose=verbose_for(data, server.config, tok, job.reqs, server.model_name, _n_probs(data)),
        )
        return await respond(
            request, server, job.reqs, fmt, data, lambda run: server.live.add(cmpl_id, run.handles, armed)
        )

    @post("/apply-template", status_code=200)
    async def apply_template(
        self, request: Request, server: SharedState, data: JSONBody[ChatBody]
    ) -> Response:
        prompt = await unless_disconnected(request, render_chat(server, data))
        return json_response({"prompt": prompt.text})

    @post(["/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"], status_code=200)
    async def input_tokens(self, request: Request, server: SharedState, data: JSONBody[ChatBody]) -> Response:
        prompt = await unless_disconnected(request, render_chat(server, data))
        return json_response({"input_tokens": len(prompt.tokens), "object": "response.input_tokens"})
