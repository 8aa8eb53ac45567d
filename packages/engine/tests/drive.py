"""Driving the scheduler by hand in tests: the test thread plays the engine loop, one request alone."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from llama_engine import Engine, GenerationRequest, RequestHandle, StopReason
from llama_engine.handles import Generate
from llama_engine.requests import TokenEvent
from llama_engine.step import Step

__all__ = ["drive_alone", "handle_tokens"]


def handle_tokens(handle: RequestHandle) -> list[int]:
    """The token events a handle has received so far, in order (consumed)."""
    out = []
    while not handle._events.empty():
        ev = handle._events.get()
        if isinstance(ev, TokenEvent):
            out.append(ev.token)
    return out


def drive_alone(
    engine: Engine, req: GenerationRequest, on_logits: Callable[[Step, np.ndarray], None] | None = None
) -> tuple[list[int], int]:
    """Run ``req`` alone to its length limit, calling ``on_logits(step, logits)`` after each forward pass;
    returns its tokens and the prompt tokens the cache served."""
    sched = engine.scheduler
    h = RequestHandle()
    sched.add(Generate(req, h))
    sched.admit()
    while (step := sched.schedule()) is not None:
        logits, hidden = engine.model.forward(step.batch, engine.kv)
        if on_logits is not None:
            on_logits(step, logits)
        sched.postprocess(step, logits, hidden)
    assert h.final is not None and h.final.reason == StopReason.LENGTH
    return handle_tokens(h), h.final.usage.cached_tokens
