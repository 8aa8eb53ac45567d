"""`prompt_progress`: prompt-processing progress events of a `return_progress` stream (endpoints.md §3, §5.3,
§6). The engine reports one ProgressEvent before the prompt is evaluated and one per evaluated chunk; each
API turns it into its own event carrying this object (and `timings` with `timings_per_token`)."""

from __future__ import annotations

from msgspec import Struct

from llama_engine import ProgressEvent

__all__ = ["PromptProgress", "progress_out"]


class PromptProgress(Struct, gc=False):
    total: int  # prompt tokens
    cache: int  # reused from the cache
    processed: int  # in the cache so far (cache + evaluated)
    time_ms: int


def progress_out(ev: ProgressEvent) -> PromptProgress:
    return PromptProgress(ev.total, ev.cache, ev.processed, ev.time_ms)
