"""POST /completion, /completions (native) and /v1/completions (OpenAI legacy), and /infill."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, post

from llama_engine import FinalEvent, GenerationRequest, StopReason, TokenEvent

from ..bridge import Run, until_disconnect
from ..errors import ApiError
from ..generation import Choice, collect, completion_id, finish_reason, prob_entry, stop_type, timings_json
from ..params import GenParams, NProbs, build_request
from ..prompts import check_text_size, tokenize_mixed, tokenize_prompts
from ..sse import DONE, PING, event, sse_response
from ._common import BUILD_INFO, generation_settings, json_response, now, read_body, server_state

__all__ = ["CompletionController"]


class CompletionBody(GenParams, kw_only=True):
    prompt: Any = None
    logprobs: NProbs | None = None  # OpenAI name of n_probs
    echo: bool | None = None
    suffix: str | None = None


class InfillExtra(msgspec.Struct, kw_only=True):
    text: str
    filename: str | None = None


class InfillBody(CompletionBody, kw_only=True):
    input_prefix: str | list[Any] | None = None
    input_suffix: str | list[Any] | None = None
    input_extra: Annotated[list[InfillExtra], msgspec.Meta(max_length=256)] | None = None


def _n_probs(body: CompletionBody) -> int:
    return body.n_probs if body.n_probs is not None else (body.logprobs or 0)


def _requests(request: Request, body: CompletionBody, prompts: list[list[int]]) -> list[GenerationRequest]:
    st = server_state(request)
    engine = st.require_engine()
    n_slots = st.config.n_parallel
    n = body.n_choices(n_slots)
    reqs = []
    for prompt in prompts:
        for i in range(n):
            reqs.append(build_request(body, prompt, st.config, engine.tokenizer, n_slots, _n_probs(body), i))
    return reqs


def native_result(
    request: Request, req: GenerationRequest, c: Choice, body: CompletionBody, stream: bool
) -> dict:
    st = server_state(request)
    tok = st.require_engine().tokenizer
    f = c.final
    assert f is not None
    text = "" if stream else c.text
    probs = c.probs
    if f.reason == StopReason.STOP_WORD and probs:
        probs = probs[: max(len(probs) - len(tok.encode(f.stop_word, add_special=False)), 0)]
    out: dict[str, Any] = {
        "index": c.index,
        "content": text,
        "tokens": c.tokens if body.return_tokens and not stream else [],
        "id_slot": f.slot,
        "stop": True,
        "model": st.model_name,
        "tokens_predicted": f.usage.completion_tokens,
        "tokens_evaluated": f.usage.prompt_tokens,
        "generation_settings": generation_settings(req, stream, eog_ids=tok.eog_ids),
        "prompt": tok.decode(req.prompt),
        "has_new_line": "\n" in c.text,
        "truncated": False,
        "stop_type": stop_type(f),
        "stopping_word": f.stop_word,
        "tokens_cached": f.usage.prompt_tokens + max(f.usage.completion_tokens - 1, 0),
        "timings": timings_json(f.timings),
    }
    if _n_probs(body) > 0 and not stream:
        out["completion_probabilities"] = probs
    if body.response_fields:
        out = _select(out, body.response_fields)
    return out


def _select(obj: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in fields:
        cur: Any = obj
        for part in path.split("/"):
            if not isinstance(cur, dict) or part not in cur:
                break
            cur = cur[part]
        else:
            out[path] = cur
    return out


def _error_of(choices: list[Choice]) -> None:
    for c in choices:
        if c.final is not None and c.final.reason == StopReason.ERROR:
            raise ApiError(c.final.error or "generation failed", "server_error")


def _usage(choices: list[Choice]) -> dict[str, Any]:
    prompt = sum(c.final.usage.prompt_tokens for c in choices if c.final)
    completion = sum(c.final.usage.completion_tokens for c in choices if c.final)
    cached = sum(c.final.usage.cached_tokens for c in choices if c.final)
    return {
        "completion_tokens": completion,
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


async def first_event(run: Run) -> tuple[int, TokenEvent | FinalEvent] | None:
    """Wait for the first event so that an error before any token is answered as a JSON error."""
    async for item in run.events():
        return item
    return None


class CompletionController(Controller):
    """Text completion: llama.cpp's native format and OpenAI's legacy `text_completion`."""

    @post(["/completion", "/completions"], status_code=200)
    async def native(self, request: Request) -> Response:
        body: CompletionBody = await read_body(request, CompletionBody)
        engine = server_state(request).require_engine()
        return await self._native(
            request, body, tokenize_prompts(body.prompt, engine.tokenizer, n_ctx=engine.n_ctx_slot)
        )

    async def _native(self, request: Request, body: CompletionBody, prompts: list[list[int]]) -> Response:
        st = server_state(request)
        tok = st.require_engine().tokenizer
        reqs = _requests(request, body, prompts)
        run = Run(st)
        run.submit_all(reqs)
        n_probs, post = _n_probs(body), bool(body.post_sampling_probs)
        if not body.stream:
            choices = await until_disconnect(request.receive, collect(run, tok, n_probs, post), run)
            _error_of(choices)
            results = [native_result(request, reqs[c.index], c, body, False) for c in choices]
            return json_response(results[0] if len(results) == 1 else results)

        async def stream() -> AsyncIterator[bytes]:
            counts = [0] * run.n
            choices = [Choice(i) for i in range(run.n)]
            try:
                async for item in run.events(_ping(st, body)):
                    if item is None:
                        yield PING
                        continue
                    i, ev = item
                    if isinstance(ev, TokenEvent):
                        counts[i] += 1
                        chunk: dict[str, Any] = {
                            "index": i, "content": ev.text, "tokens": [ev.token], "stop": False, "id_slot": -1,
                            "tokens_predicted": counts[i], "tokens_evaluated": len(reqs[i].prompt),
                        }  # fmt: skip
                        if ev.timings is not None:  # asked for with timings_per_token
                            chunk["timings"] = timings_json(ev.timings)
                        if n_probs > 0 and ev.top:
                            chunk["completion_probabilities"] = [prob_entry(tok, ev, post)]
                        yield event(chunk)
                    else:
                        if ev.reason == StopReason.ERROR:
                            yield event({"error": {"code": 500, "message": ev.error, "type": "server_error"}})
                            return
                        if ev.text:
                            yield event({"index": i, "content": ev.text, "tokens": [], "stop": False, "id_slot": -1,
                                         "tokens_predicted": counts[i], "tokens_evaluated": len(reqs[i].prompt)})  # fmt: skip
                        choices[i].final = ev
                        yield event(native_result(request, reqs[i], choices[i], body, True))
            finally:
                run.cancel()

        await run.check_first(request.receive)
        return sse_response(stream())

    @post("/v1/completions", status_code=200)
    async def openai(self, request: Request) -> Response:
        st = server_state(request)
        body: CompletionBody = await read_body(request, CompletionBody)
        if body.prompt is None:
            raise ApiError('"prompt" must be provided')
        engine = st.require_engine()
        tok = engine.tokenizer
        reqs = _requests(request, body, tokenize_prompts(body.prompt, tok, n_ctx=engine.n_ctx_slot))
        run = Run(st)
        run.submit_all(reqs)
        n_probs, post = _n_probs(body), bool(body.post_sampling_probs)
        cid, created = completion_id(), now()
        head = {"created": created, "model": st.model_name, "system_fingerprint": BUILD_INFO,
                "object": "text_completion", "id": cid}  # fmt: skip
        if not body.stream:
            choices = await until_disconnect(request.receive, collect(run, tok, n_probs, post), run)
            _error_of(choices)
            out = {
                "choices": [
                    {
                        "text": c.text,
                        "index": c.index,
                        "logprobs": {"content": c.probs} if n_probs > 0 else None,
                        "finish_reason": finish_reason(c.final),
                    }
                    for c in choices
                ],
                "created": created,
                "model": st.model_name,
                "system_fingerprint": BUILD_INFO,
                "object": "text_completion",
                "usage": _usage(choices),
                "id": cid,
                "timings": timings_json(choices[0].final.timings),  # type: ignore[union-attr]
            }
            return json_response(out)

        async def stream() -> AsyncIterator[bytes]:
            try:
                async for item in run.events(_ping(st, body)):
                    if item is None:
                        yield PING
                        continue
                    i, ev = item
                    if isinstance(ev, TokenEvent):
                        lp = {"content": [prob_entry(tok, ev, post)]} if n_probs > 0 and ev.top else None
                        if ev.text or lp:
                            tm = {"timings": timings_json(ev.timings)} if ev.timings is not None else {}
                            yield event({"choices": [{"text": ev.text, "index": i, "logprobs": lp,
                                                      "finish_reason": None}], **head, **tm})  # fmt: skip
                        continue
                    if ev.reason == StopReason.ERROR:
                        yield event({"error": {"code": 500, "message": ev.error, "type": "server_error"}})
                        return
                    if ev.text:
                        yield event({"choices": [{"text": ev.text, "index": i, "logprobs": None,
                                                  "finish_reason": None}], **head})  # fmt: skip
                    c = Choice(i, final=ev)
                    yield event({"choices": [{"text": "", "index": i, "logprobs": None,
                                              "finish_reason": finish_reason(ev)}],
                                 **head, "usage": _usage([c]), "timings": timings_json(ev.timings)})  # fmt: skip
                yield DONE
            finally:
                run.cancel()

        await run.check_first(request.receive)
        return sse_response(stream())

    @post("/infill", status_code=200)
    async def infill(self, request: Request) -> Response:
        st = server_state(request)
        tok = st.require_engine().tokenizer
        fim = tok.fim_ids
        for key, name in (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle")):
            if fim[key] is None:
                raise ApiError(
                    f"Infill is not supported by this model: {name} token is missing. ", "not_supported_error"
                )
        body: InfillBody = await read_body(request, InfillBody)
        if body.input_prefix is None or body.input_suffix is None:
            raise ApiError('"input_prefix" and "input_suffix" are required')

        check_text_size(
            sum(len(x) for x in (body.input_prefix, body.input_suffix) if isinstance(x, str)),
            tok,
            st.require_engine().n_ctx_slot,
        )

        def enc(v: str | list[Any]) -> list[int]:
            if isinstance(v, str):
                return tok.encode(v, add_special=False, parse_special=False)
            return tokenize_mixed(v, tok, parse_special=False, add_special=False)

        n_batch = st.config.n_batch
        prefix = enc(body.input_prefix)[-(3 * (n_batch // 4)) :]
        extra_prompt = (
            tok.encode(body.prompt, add_special=False, parse_special=True)
            if isinstance(body.prompt, str)
            else []
        )
        suffix = enc(body.input_suffix)[: max(0, n_batch // 4 - 2 - len(extra_prompt))]
        ctx: list[int] = []
        for chunk in body.input_extra or []:
            ctx += tok.encode("\n\n--- snippet ---\n\n" + chunk.text, add_special=False, parse_special=False)
        bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
        prompt: list[int] = [*ctx, *bos, fim["pre"], *prefix, *extra_prompt, fim["suf"], *suffix, fim["mid"]]  # type: ignore[list-item]
        body = msgspec.structs.replace(body, prompt=None)
        return await self._native(request, body, [prompt])


def _ping(st: Any, body: GenParams) -> float | None:
    v = body.sse_ping_interval if body.sse_ping_interval is not None else st.config.sse_ping_interval
    return float(v) if v and v > 0 else None
