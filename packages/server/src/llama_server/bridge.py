"""The seam between HTTP handlers and the engine thread.

Handlers never touch the model: they submit typed requests and read events. The engine calls each
handle's `on_event` from its own thread; the event goes into the event loop's `_Mailbox`, which wakes the
loop once for everything posted meanwhile (one wake-up per engine step, not one per stream), and each
`Run` hands its events in order to its handler, or straight to a sink (the streaming driver). A client
that goes away cancels its requests (`RequestHandle.cancel`), so the slot is freed at the next engine step.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, Protocol, TypeAlias, TypeVar

import msgspec

from llama_engine import (
    FinalEvent,
    GenerationRequest,
    ProgressEvent,
    QueueFullError,
    RequestHandle,
    StopReason,
    Timings,
    TokenEvent,
    Usage,
)

from .errors import ApiError
from .state import ServerState, SlotRecord

__all__ = ["Cancellable", "Event", "Run", "Wakeup", "resolve", "until_disconnect"]


Event: TypeAlias = TokenEvent | ProgressEvent | FinalEvent
T = TypeVar("T")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class _Mailbox:
    """Events posted from the engine thread for one event loop, delivered in posting order by a single
    scheduled callback per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: collections.deque[tuple[Run, int, Event]] = collections.deque()
        self.scheduled = False

    def post(self, run: Run, index: int, ev: Event) -> None:  # the engine thread
        self.items.append((run, index, ev))
        if not self.scheduled:  # cleared by _flush before it drains, so nothing posted is left behind
            self.scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
                self.loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        self.scheduled = False
        while self.items:
            run, index, ev = self.items.popleft()
            run._deliver((index, ev))


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = weakref.WeakKeyDictionary()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    box = _mailboxes.get(loop)
    if box is None:
        box = _mailboxes[loop] = _Mailbox(loop)
    return box


class Run:
    """The engine requests of one HTTP request (one per prompt and choice), their events in arrival order."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.loop = asyncio.get_running_loop()
        self._box = _mailbox(self.loop)
        self._items: collections.deque[tuple[int, Event]] = collections.deque()
        self._wakeup = Wakeup(self.loop)
        self._sink: Callable[[int, Event], None] | None = None
        self.handles: list[RequestHandle] = []
        self.n = 0
        self.task_ids: list[int] = []
        self.scope = ""  # the cache scope of the requests (one HTTP request: one caller)
        # with /metrics on, every request reports its prompt batches (counted as they are evaluated);
        # index -> (the client asked for the updates, tokens in the cache at the last one)
        self._progress: dict[int, tuple[bool, int]] = {}
        # with /metrics on: when each request was submitted and when its last token came (the histograms)
        self._submitted: dict[int, float] = {}
        self._last_token: dict[int, float] = {}

    def submit_all(self, requests: list[GenerationRequest]) -> None:
        """Validate every prompt against the slot context, then queue them all (or none: when the engine's
        queue is full part way, the ones already queued are cancelled)."""
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
        self.scope = requests[0].cache_scope if requests else ""
        for i, req in enumerate(requests):
            self.task_ids.append(self.state.task_id())
            if not req.prompt:  # not an error: an empty result
                empty = FinalEvent(StopReason.EOS, Usage(0, 0, 0), Timings(0, 0.0, 0, 0.0, 0))
                self._deliver((i, empty))
                continue
            if self.state.config.endpoint_metrics:
                self._progress[i] = (req.return_progress, -1)
                self._submitted[i] = time.monotonic()
                req = msgspec.structs.replace(req, return_progress=True)
            try:
                self.handles.append(engine.submit(req, on_event=partial(self._on_event, i)))
            except QueueFullError as e:
                self.cancel()
                raise ApiError(
                    f"the server is busy ({e}); try again later",
                    "unavailable_error",
                    headers={"Retry-After": "1"},
                ) from e
            except ValueError as e:
                self.cancel()
                raise ApiError(str(e)) from e

    def _on_event(self, index: int, ev: Event) -> None:  # called on the engine thread
        self._box.post(self, index, ev)

    def _deliver(self, item: tuple[int, Event]) -> None:  # on the event loop
        index, ev = item
        if isinstance(ev, ProgressEvent) and index in self._progress and not self._count(index, ev):
            return  # an update only /metrics asked for
        if index in self._submitted:
            self._time(index, ev)
        if isinstance(ev, FinalEvent):
            self._record(index, ev)
        if self._sink is not None:
            self._sink(index, ev)
            return
        self._items.append(item)
        self._wakeup.set()

    def _time(self, index: int, ev: Event) -> None:
        """Observe a request's latencies (llama_server.latency) as its events are handed on."""
        histograms = self.state.latency
        if histograms is None or isinstance(ev, ProgressEvent):
            return
        t = time.monotonic()
        if isinstance(ev, TokenEvent):
            last = self._last_token.get(index)
            if last is None:
                histograms.first_token(t - self._submitted[index])
            else:
                histograms.inter_token(t - last)
            self._last_token[index] = t
        elif ev.reason not in (StopReason.ERROR, StopReason.CANCELLED):
            e2e = t - self._submitted[index]
            busy = (ev.timings.prompt_ms + ev.timings.predicted_ms) / 1e3
            histograms.finished(e2e, e2e - busy, ev.usage.prompt_tokens, ev.usage.completion_tokens)

    def _count(self, index: int, ev: ProgressEvent) -> bool:
        """Count a prompt update's newly evaluated tokens; True when the client asked for updates."""
        wanted, last = self._progress[index]
        if last < 0:  # the first update: the reused prefix
            self.state.metrics.prompt_batch(0, ev.cache)
            last = ev.cache
        self.state.metrics.prompt_batch(ev.processed - last)
        self._progress[index] = (wanted, ev.processed)
        return wanted

    def attach(self, sink: Callable[[int, Event], None]) -> None:
        """From now on hand every event to `sink(index, event)` as it arrives (on the event loop, in the
        mailbox's one callback per engine step), the ones already waiting first. `events()` then sees
        nothing: the sink is the consumer."""
        while self._items:
            sink(*self._items.popleft())
        self._sink = sink

    async def _next(self, timeout: float | None) -> tuple[int, Event] | None:
        """The next event, or None when ``timeout`` seconds pass without one (events stay in ``_items``
        until taken, so a timeout never loses one)."""
        if not self._items:
            await self._wakeup.wait(timeout)
            if not self._items:
                return None
        return self._items.popleft()

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
        item = await until_disconnect(receive, self._next(None), self)
        assert item is not None  # no timeout
        self._items.appendleft(item)  # events() yields it first
        ev = item[1]
        if isinstance(ev, FinalEvent) and ev.reason == StopReason.ERROR:
            self.cancel()
            raise ApiError(ev.error or "generation failed", "server_error")

    async def events(self, ping_seconds: float | None = None) -> AsyncIterator[tuple[int, Event] | None]:
        """(index, event) in arrival order until every request's FinalEvent; None when `ping_seconds`
        passed without an event (the SSE keep-alive)."""
        remaining = self.n
        while remaining:
            item = await self._next(ping_seconds)
            if item is None:
                yield None
                continue
            if isinstance(item[1], FinalEvent):
                remaining -= 1
            yield item

    def _record(self, index: int, ev: FinalEvent) -> None:
        if ev.reason == StopReason.ERROR:
            return
        self.state.metrics.record(ev, index in self._progress)
        if ev.slot >= 0:
            t = ev.timings
            self.state.slots[ev.slot] = SlotRecord(
                id_task=self.task_ids[index],
                n_prompt_tokens=ev.usage.prompt_tokens,
                n_prompt_tokens_processed=t.prompt_n,
                n_prompt_tokens_cache=t.cache_n,
                n_decoded=t.predicted_n,
                scope=self.scope,
            )


def resolve(waiter: asyncio.Future[None]) -> None:
    """Complete `waiter` unless it already is (a timer and an event may both try)."""
    if not waiter.done():
        waiter.set_result(None)


class Wakeup:
    """Wake one waiting task from event-loop callbacks (a plain future: no task per event)."""

    __slots__ = ("_waiter", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        if self._waiter is not None:
            resolve(self._waiter)

    async def wait(self, timeout: float | None) -> None:
        """Until `set()`, or `timeout` seconds (None: no limit)."""
        waiter = self._waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, resolve, waiter) if timeout else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()


async def _wait_disconnect(receive: Callable[[], Awaitable[Any]]) -> None:
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return


async def until_disconnect(receive: Callable[[], Awaitable[Any]], work: Awaitable[T], run: Cancellable) -> T:
    """Await `work`, cancelling the engine requests (`run.cancel()`) if the client disconnects first."""
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
