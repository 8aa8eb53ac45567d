"""The seam between HTTP handlers and the engine thread.

Handlers never touch the model: they submit typed requests and read events. The engine calls each
handle's `on_event` from its own thread; `loop.call_soon_threadsafe` moves the event onto an asyncio
queue read by the handler. A client that goes away cancels its requests (`RequestHandle.cancel`), so the
slot is freed at the next engine step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, TypeAlias, TypeVar

import msgspec

from llama_engine import (
    FinalEvent,
    GenerationRequest,
    QueueFullError,
    RequestHandle,
    StopReason,
    Timings,
    TokenEvent,
    Usage,
)

from .errors import ApiError
from .state import ServerState, SlotRecord

__all__ = ["Event", "Run", "until_disconnect"]

Event: TypeAlias = TokenEvent | FinalEvent
T = TypeVar("T")


class Run:
    """The engine requests of one HTTP request (one per prompt and choice), events on one queue."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.handles: list[RequestHandle] = []
        self.n = 0
        self.task_ids: list[int] = []
        self._pending: list[tuple[int, Event]] = []
        self._unreleased = 0
        self._prompt_only: set[int] = set()

    def submit_all(self, requests: list[GenerationRequest]) -> None:
        """Validate every prompt against the slot context, then queue them all (or none)."""
        engine = self.state.require_engine()
        n_ctx, n_vocab = engine.n_ctx_slot, engine.tokenizer.n_vocab
        for req in requests:
            if len(req.prompt) >= n_ctx:
                raise ApiError(
                    f"request ({len(req.prompt)} tokens) exceeds the available context size ({n_ctx} tokens), "
                    "try increasing it",
                    "exceed_context_size_error",
                    n_prompt_tokens=len(req.prompt),
                    n_ctx=n_ctx,
                )
            if req.prompt and (min(req.prompt) < 0 or max(req.prompt) >= n_vocab):
                raise ApiError("Prompt contains invalid tokens")
        self.n = len(requests)
        st = self.state
        limit = st.config.n_parallel + st.config.max_queue
        with st.inflight_lock:
            if st.inflight + len(requests) > limit:
                raise ApiError(
                    f"the server is busy ({st.inflight} requests in flight); try again later",
                    "unavailable_error",
                    headers={"Retry-After": "1"},
                )
            st.inflight += len(requests)
        self._unreleased = len(requests)
        for i, req in enumerate(requests):
            self.task_ids.append(self.state.task_id())
            if not req.prompt:  # not an error: an empty result
                self._release(1)
                empty = FinalEvent(StopReason.EOS, Usage(0, 0, 0), Timings(0, 0.0, 0, 0.0, 0))
                self.queue.put_nowait((i, empty))
                continue
            if req.max_tokens == 0:
                # n_predict 0 evaluates the prompt only; the engine samples at least one token, which is
                # dropped here (see _on_event)
                self._prompt_only.add(i)
                req = msgspec.structs.replace(req, max_tokens=1)
            try:
                self.handles.append(engine.submit(req, on_event=partial(self._on_event, i)))
            except QueueFullError as e:
                self._release(len(requests) - i)
                self.cancel()
                raise ApiError(
                    f"the server is busy ({e}); try again later",
                    "unavailable_error",
                    headers={"Retry-After": "1"},
                ) from e
            except ValueError as e:
                self._release(len(requests) - i)
                self.cancel()
                raise ApiError(str(e)) from e

    def _release(self, n: int) -> None:
        with self.state.inflight_lock:
            n = min(n, self._unreleased)
            self._unreleased -= n
            self.state.inflight -= n

    def _on_event(self, index: int, ev: Event) -> None:  # called on the engine thread
        if isinstance(ev, FinalEvent):
            self._release(1)
        if index in self._prompt_only:
            if isinstance(ev, TokenEvent):
                return
            t, u = ev.timings, ev.usage
            ev = msgspec.structs.replace(
                ev,
                reason=StopReason.LENGTH if ev.reason != StopReason.ERROR else ev.reason,
                usage=Usage(u.prompt_tokens, 0, u.cached_tokens),
                timings=Timings(t.prompt_n, t.prompt_ms, 0, 0.0, t.cache_n),
                text="",
                stop_word="",
            )
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, ev))

    def cancel(self) -> None:
        for h in self.handles:
            if h.final is None:
                h.cancel()

    @property
    def done(self) -> bool:
        return all(h.final is not None for h in self.handles)

    async def check_first(self, receive: Callable[[], Awaitable[Any]]) -> None:
        """Wait for the first event of a stream: an error there is answered as a JSON error with its
        status, not as an SSE stream (the reference's rule)."""
        if self.n == 0:
            return
        item = await until_disconnect(receive, self.queue.get(), self)
        self._pending.append(item)
        ev = item[1]
        if isinstance(ev, FinalEvent) and ev.reason == StopReason.ERROR:
            self.cancel()
            raise ApiError(ev.error or "generation failed", "server_error")

    async def events(self, ping_seconds: float | None = None) -> AsyncIterator[tuple[int, Event] | None]:
        """(index, event) in arrival order until every request's FinalEvent; None when `ping_seconds`
        passed without an event (the SSE keep-alive)."""
        remaining = self.n
        # One pending get at a time, never cancelled by a timeout: asyncio.wait_for(queue.get()) can drop an
        # item that arrives just as the timeout fires (Python < 3.12), which would lose an event.
        getter: asyncio.Future[tuple[int, Event]] | None = None
        try:
            while remaining:
                if self._pending:
                    item = self._pending.pop(0)
                else:
                    if getter is None:
                        getter = asyncio.ensure_future(self.queue.get())
                    done, _ = await asyncio.wait({getter}, timeout=ping_seconds or None)
                    if not done:
                        yield None
                        continue
                    item, getter = getter.result(), None
                index, ev = item
                if isinstance(ev, FinalEvent):
                    remaining -= 1
                    self._record(index, ev)
                yield item
        finally:
            if getter is not None:
                getter.cancel()

    def _record(self, index: int, ev: FinalEvent) -> None:
        if ev.reason == StopReason.ERROR:
            return
        self.state.metrics.record(ev)
        if ev.slot >= 0:
            t = ev.timings
            self.state.slots[ev.slot] = SlotRecord(
                id_task=self.task_ids[index],
                n_prompt_tokens=ev.usage.prompt_tokens,
                n_prompt_tokens_processed=t.prompt_n,
                n_prompt_tokens_cache=t.cache_n,
                n_decoded=t.predicted_n,
            )


async def _wait_disconnect(receive: Callable[[], Awaitable[Any]]) -> None:
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return


async def until_disconnect(receive: Callable[[], Awaitable[Any]], work: Awaitable[T], run: Run) -> T:
    """Await `work`, cancelling the run's engine requests if the client disconnects first."""
    work_task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({work_task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work_task.done():
            run.cancel()
            work_task.cancel()
        watch.cancel()
    if not work_task.done() or work_task.cancelled():
        raise ApiError("client disconnected", "invalid_request_error")
    return work_task.result()
