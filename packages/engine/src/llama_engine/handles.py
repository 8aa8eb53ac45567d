"""What callers hold and what they post: request handles and the engine's typed inbox messages.

A caller's thread builds a handle and posts one message; the engine thread reads the inbox, schedules the
work and reports back through the handle. Cancelling sets the handle's `threading.Event` (read by the
scheduler every step) and wakes the loop, so a request waiting for something still gets its final event.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .requests import EmbeddingRequest, FinalEvent, GenerationRequest, ProgressEvent, TokenEvent

if TYPE_CHECKING:
    from .sampling import Sampler
    from .slot import Parked

__all__ = [
    "Embed",
    "EmbeddingHandle",
    "Generate",
    "Message",
    "RequestCancelledError",
    "RequestHandle",
    "Shutdown",
    "SlotOp",
    "Wake",
]

Event = TokenEvent | ProgressEvent | FinalEvent


class RequestCancelledError(RuntimeError):
    """The request was cancelled before it finished."""


class RequestHandle:
    """Events of one request, in order: TokenEvents, then one FinalEvent. Iterable; cancellable.

    With `on_event`, each event is handed to it on the engine thread instead of being queued for
    iteration; `on_final` runs (also on the engine thread) just before the final event is delivered.
    """

    def __init__(
        self,
        on_event: Callable[[Event], None] | None = None,
        on_final: Callable[[], None] | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._on_event = on_event
        self._on_final = on_final
        self._wake = wake
        self.cancelled = threading.Event()
        self.final: FinalEvent | None = None
        self.sampler: Sampler | None = None  # set by the engine thread when the request takes a slot

    def _emit(self, ev: Event) -> None:
        if isinstance(ev, FinalEvent):
            self.final = ev
            if self._on_final is not None:
                self._on_final()
        if self._on_event is not None:
            self._on_event(ev)
        else:
            self._events.put(ev)

    def cancel(self) -> None:
        """Stop the generation at the next step; the slot is freed and its cache kept for reuse."""
        self.cancelled.set()
        if self._wake is not None:
            self._wake()

    def end_reasoning(self) -> bool:
        """End the thinking block at the next token (a control request): the reasoning budget forces its
        closing sequence. False when the request holds no slot (waiting or finished) or has no budget."""
        sampler = self.sampler
        if self.final is not None or sampler is None or sampler.budget is None:
            return False
        sampler.budget.request_end()
        if self._wake is not None:
            self._wake()
        return True

    def __iter__(self) -> Iterator[Event]:
        while True:
            ev = self._events.get()
            yield ev
            if isinstance(ev, FinalEvent):
                return


class EmbeddingHandle:
    """A queued embedding request: `result()` blocks for the vector, `cancel()` stops it at the next step."""

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        self.cancelled = threading.Event()
        self._wake = wake
        self._done: queue.SimpleQueue[np.ndarray | BaseException] = queue.SimpleQueue()

    def cancel(self) -> None:
        self.cancelled.set()
        if self._wake is not None:
            self._wake()

    def _deliver(self, result: np.ndarray | BaseException) -> None:
        self._done.put(result)

    def result(self) -> np.ndarray:
        """The embedding; raises RequestCancelledError when cancelled, or the request's error."""
        result = self._done.get()
        self._done.put(result)  # result() may be called again
        if isinstance(result, BaseException):
            raise result
        return result


# -- the inbox: what callers post to the engine thread ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Generate:
    """Queue a generation."""

    request: GenerationRequest
    handle: RequestHandle
    arrival: float = field(default_factory=time.perf_counter)  # prompt work is served oldest first
    parked: Parked | None = None  # a preempted request coming back (its request's prompt is its cache)


@dataclass(frozen=True, slots=True)
class Embed:
    """Queue an embedding (or the pooled states a reranker reads)."""

    request: EmbeddingRequest
    handle: EmbeddingHandle
    arrival: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True, slots=True)
class SlotOp:
    """Run `fn` on the engine thread once `slot` is idle; its result (or error) goes to `done`."""

    slot: int
    fn: Callable[[], Any]
    done: queue.SimpleQueue[Any]


@dataclass(frozen=True, slots=True)
class Wake:
    """Nothing to do but look again: a cancellation, or a table a waiting request needs is ready."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stop the loop: every request still open gets its final event (an error)."""


Message = Generate | Embed | SlotOp | Wake | Shutdown
