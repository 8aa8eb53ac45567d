"""Prompt-progress events (llama-server's `return_progress`): how much of a slot's prompt is in the cache."""

from __future__ import annotations

import time

from .requests import ProgressEvent, Timings
from .slot import Slot

__all__ = ["progress_event"]


def progress_event(s: Slot, start: bool = False) -> ProgressEvent:
    """The slot's prompt progress now; `start`: before any token is evaluated (processed == cache, 0 ms).
    Timings (the prompt part) when the request asked for `timings_per_token`."""
    assert s.request is not None
    ms = 0.0 if start else (time.perf_counter() - s.t_start) * 1e3
    done = len(s.tokens)
    timings = Timings(done - s.n_cached, ms, 0, 0.0, s.n_cached) if s.request.timings_per_token else None
    return ProgressEvent(s.n_prompt, s.n_cached, done, int(ms), timings)
