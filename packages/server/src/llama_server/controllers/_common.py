"""Helpers shared by the controllers: JSON responses, generation settings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from litestar import Request, Response
from litestar.di import NamedDependency

from llama_engine import GenerationRequest

from ..bridge import until_disconnect
from ..sse import encode
from ..state import BUILD_INFO, ServerState

__all__ = [
    "BUILD_INFO",
    "SharedState",
    "generation_settings",
    "json_response",
    "json_response_off_loop",
    "now",
    "unless_disconnected",
]

T = TypeVar("T")

SharedState = NamedDependency[ServerState]
"""A handler parameter `server: SharedState` receives the app's ServerState (the `server` dependency)."""

JSON = "application/json; charset=utf-8"


class _NoEngineWork:
    def cancel(self) -> None:  # nothing is queued on the engine: dropping the awaited work is enough
        pass


async def unless_disconnected(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Await work that holds no engine request (tokenizing, rendering off the loop); a client that goes
    away meanwhile cancels it (work not started is dropped, a running call's result is discarded)."""
    return await until_disconnect(request.receive, work, _NoEngineWork())


def json_response(obj: Any, status: int = 200) -> Response[bytes]:
    return Response(encode(obj), status_code=status, media_type=JSON)


async def json_response_off_loop(build: Callable[[], Any]) -> Response[bytes]:
    """A JSON response whose body is built and encoded on a worker thread: for large bodies (a long input's
    per-token embeddings are ~19 MB of JSON, ~80 ms to build and encode) that would stall every other
    stream if the event loop did it."""
    body = await asyncio.to_thread(lambda: encode(build()))
    return Response(body, status_code=200, media_type=JSON)


def now() -> int:
    return int(time.time())


def generation_settings(
    req: GenerationRequest, stream: bool, full: bool = True, eog_ids: Iterable[int] = ()
) -> dict[str, Any]:
    """llama.cpp's `generation_settings` (endpoints.md §3.1); the reduced form omits the list fields.
    `ignore_eos` shows as a -inf bias (serialised as null) on every end-of-generation token, as llama.cpp."""
    s = req.sampling
    bias = [{"bias": b, "token": t} for t, b in s.logit_bias]
    if s.ignore_eos:
        bias += [{"bias": float("-inf"), "token": t} for t in sorted(eog_ids)]
    out: dict[str, Any] = {
        "seed": s.seed,
        "temperature": s.temperature,
        "dynatemp_range": s.dynatemp_range,
        "dynatemp_exponent": s.dynatemp_exponent,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "top_n_sigma": s.top_n_sigma,
        "xtc_probability": s.xtc_probability,
        "xtc_threshold": s.xtc_threshold,
        "typical_p": s.typical_p,
        "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "dry_multiplier": s.dry_multiplier,
        "dry_base": s.dry_base,
        "dry_allowed_length": s.dry_allowed_length,
        "dry_penalty_last_n": s.dry_penalty_last_n,
        "dry_sequence_breakers": list(s.dry_sequence_breakers),
        "mirostat": s.mirostat,
        "mirostat_tau": s.mirostat_tau,
        "mirostat_eta": s.mirostat_eta,
        "adaptive_target": -1.0,
        "adaptive_decay": 0.9,
        "stop": list(req.stop),
        "max_tokens": req.max_tokens,
        "n_predict": req.max_tokens,
        "n_keep": req.n_keep,
        "n_discard": req.n_discard,
        "ignore_eos": s.ignore_eos,
        "stream": stream,
        "logit_bias": bias,
        "n_probs": s.n_probs,
        "min_keep": s.min_keep,
        "grammar": "",
        "grammar_lazy": False,
        "grammar_triggers": [],
        "preserved_tokens": [],
        "chat_format": "Content-only",
        "reasoning_format": "none",
        "reasoning_in_content": False,
        "generation_prompt": "",
        "samplers": list(s.samplers),
        "speculative.types": "none",
        "timings_per_token": req.timings_per_token,
        "post_sampling_probs": req.post_sampling_probs,
        "backend_sampling": False,
        "lora": [],
    }
    if not full:
        for key in _LIST_SETTINGS:
            del out[key]
    return out


_LIST_SETTINGS = (
    "dry_sequence_breakers",
    "stop",
    "logit_bias",
    "grammar",
    "grammar_lazy",
    "grammar_triggers",
    "preserved_tokens",
)
