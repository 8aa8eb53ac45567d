"""POST /v1/chat/completions (and /chat/completions), /apply-template and the input-token counter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar import Controller, Request, Response, post

from llama_engine import StopReason, TokenEvent

from ..bridge import Run, until_disconnect
from ..chat_parser import ChatParser, Parsed
from ..chat_prompt import ChatBody, build_chat_prompt
from ..errors import ApiError
from ..generation import Choice, collect, completion_id, finish_reason, prob_entry, timings_json
from ..params import build_request
from ..sse import DONE, PING, event, sse_response
from ._common import BUILD_INFO, json_response, now, read_body, server_state

__all__ = ["ChatController", "ChatRun", "start_chat"]


class ChatRun:
    """A chat request after prompt building and submission: what the response formats need."""

    def __init__(self, request: Request, body: ChatBody) -> None:
        self.st = server_state(request)
        st = self.st
        engine = st.require_engine()
        self.tok = engine.tokenizer
        self.body = body
        self.prompt = build_chat_prompt(st, body)
        self.n_probs = (body.top_logprobs if body.top_logprobs is not None else 20) if body.logprobs else 0
        self.post = bool(body.post_sampling_probs)
        n = body.n_choices(st.config.n_parallel)
        self.reqs = [
            build_request(
                body, self.prompt.tokens, st.config, self.tok, st.config.n_parallel, self.n_probs, i
            )
            for i in range(n)
        ]
        fmt = body.reasoning_format or st.config.reasoning_format
        if fmt not in ("none", "auto", "deepseek", "deepseek-legacy"):
            raise ApiError(f"Unknown reasoning format: {fmt}", "server_error")
        self.reasoning = fmt != "none"
        self.tools = bool(body.tools) and body.tool_choice != "none"
        self.run = Run(st)
        self.id = completion_id()
        self.created = now()

    def parser(self) -> ChatParser:
        return ChatParser(self.reasoning, self.tools)

    def usage(self, choices: list[Choice]) -> dict[str, Any]:
        prompt = sum(c.final.usage.prompt_tokens for c in choices if c.final) // max(len(choices), 1)
        completion = sum(c.final.usage.completion_tokens for c in choices if c.final)
        cached = max((c.final.usage.cached_tokens for c in choices if c.final), default=0)
        return {"completion_tokens": completion, "prompt_tokens": prompt, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


async def start_chat(request: Request, body: ChatBody) -> ChatRun:
    chat = ChatRun(request, body)
    chat.run.submit_all(chat.reqs)
    return chat


def _message(p: Parsed) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": p.content}
    if p.reasoning:
        msg["reasoning_content"] = p.reasoning
    if p.tool_calls:
        msg["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}, "id": c.id}
            for c in p.tool_calls
        ]
    return msg


def _delta(prev: Parsed, new: Parsed) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if len(new.reasoning) > len(prev.reasoning):
        d["reasoning_content"] = new.reasoning[len(prev.reasoning) :]
    if len(new.content) > len(prev.content):
        d["content"] = new.content[len(prev.content) :]
    calls = []
    for i, c in enumerate(new.tool_calls[len(prev.tool_calls) :], start=len(prev.tool_calls)):
        calls.append(
            {
                "index": i,
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
        )
    if calls:
        d["tool_calls"] = calls
    return d


class ChatController(Controller):
    """OpenAI chat completions over the model's chat template."""

    @post(["/v1/chat/completions", "/chat/completions"], status_code=200)
    async def chat(self, request: Request) -> Response:
        body: ChatBody = await read_body(request, ChatBody)
        chat = await start_chat(request, body)
        st, run = chat.st, chat.run
        head = {
            "created": chat.created,
            "id": chat.id,
            "model": st.model_name,
            "system_fingerprint": BUILD_INFO,
        }
        if not body.stream:
            choices = await until_disconnect(
                request.receive, collect(run, chat.tok, chat.n_probs, chat.post), run
            )
            for c in choices:
                if c.final is not None and c.final.reason == StopReason.ERROR:
                    raise ApiError(c.final.error, "server_error")
            out_choices = []
            for c in choices:
                parsed = chat.parser().parse(c.text, final=True)
                ch: dict[str, Any] = {"finish_reason": finish_reason(c.final, bool(parsed.tool_calls)), "index": c.index,
                                      "message": _message(parsed)}  # fmt: skip
                if chat.n_probs:
                    ch["logprobs"] = {"content": c.probs}
                out_choices.append(ch)
            return json_response(
                {
                    "choices": out_choices,
                    "created": chat.created,
                    "model": st.model_name,
                    "system_fingerprint": BUILD_INFO,
                    "object": "chat.completion",
                    "usage": chat.usage(choices),
                    "id": chat.id,
                    "timings": timings_json(choices[0].final.timings),  # type: ignore[union-attr]
                }
            )
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def stream() -> AsyncIterator[bytes]:
            n = run.n
            texts = [""] * n
            parsers = [chat.parser() for _ in range(n)]
            prev = [Parsed() for _ in range(n)]
            started = [False] * n
            choices = [Choice(i) for i in range(n)]

            def chunk(i: int, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
                return event({"choices": [{"finish_reason": finish, "index": i, "delta": delta}], **head,
                              "object": "chat.completion.chunk", **extra})  # fmt: skip

            try:
                async for item in run.events(_ping(st, body)):
                    if item is None:
                        yield PING
                        continue
                    i, ev = item
                    if not started[i]:
                        started[i] = True
                        yield chunk(i, {"role": "assistant", "content": None})
                    if isinstance(ev, TokenEvent):
                        texts[i] += ev.text
                        new = parsers[i].parse(texts[i], final=False)
                        d = _delta(prev[i], new)
                        prev[i] = new
                        lp = (
                            {"logprobs": {"content": [prob_entry(chat.tok, ev, chat.post)]}}
                            if chat.n_probs and ev.top
                            else {}
                        )
                        tm = {"timings": timings_json(ev.timings)} if ev.timings is not None else {}
                        if d or lp:
                            if lp:
                                yield event({"choices": [{"finish_reason": None, "index": i, "delta": d, **lp}], **head,
                                             "object": "chat.completion.chunk", **tm})  # fmt: skip
                            else:
                                yield chunk(i, d, None, **tm)
                        continue
                    if ev.reason == StopReason.ERROR:
                        yield event({"error": {"code": 500, "message": ev.error, "type": "server_error"}})
                        return
                    texts[i] += ev.text
                    new = parsers[i].parse(texts[i], final=True)
                    d = _delta(prev[i], new)
                    if d:
                        yield chunk(i, d)
                    choices[i].final = ev
                    yield chunk(
                        i, {}, finish_reason(ev, bool(new.tool_calls)), timings=timings_json(ev.timings)
                    )
                if include_usage:
                    yield event(
                        {
                            "choices": [],
                            **head,
                            "object": "chat.completion.chunk",
                            "usage": chat.usage(choices),
                        }
                    )
                yield DONE
            finally:
                run.cancel()

        await run.check_first(request.receive)
        return sse_response(stream())

    @post("/apply-template", status_code=200)
    async def apply_template(self, request: Request) -> Response:
        body: ChatBody = await read_body(request, ChatBody)
        prompt = build_chat_prompt(server_state(request), body)
        return json_response({"prompt": prompt.text})

    @post(["/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"], status_code=200)
    async def input_tokens(self, request: Request) -> Response:
        body: ChatBody = await read_body(request, ChatBody)
        prompt = build_chat_prompt(server_state(request), body)
        return json_response({"input_tokens": len(prompt.tokens), "object": "response.input_tokens"})


def _ping(st: Any, body: ChatBody) -> float | None:
    v = body.sse_ping_interval if body.sse_ping_interval is not None else st.config.sse_ping_interval
    return float(v) if v and v > 0 else None
