"""The seam between HTTP handlers and the engine thread.

Handlers never touch the model: they submit typed requests and read events. The engine calls each
handle's `on_event` from its own thread; `loop.call_soon_threadsafe` moves the event onto an asyncio
queue read by the handler. A client that goes away cancels its requests (`RequestHandle.cancel`), so the
slot is freed at the next engine step.

`IOTimeouts` wraps the whole ASGI app: `--timeout` as cpp-httplib's read and write timeouts, so a client that
stops sending its request body, or stops reading the response, cannot hold a connection (and a slot) forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, Protocol, TypeAlias, TypeVar

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

__all__ = ["Cancellable", "Event", "IOTimeouts", "Run", "until_disconnect"]

log = logging.getLogger("llama_server")

Event: TypeAlias = TokenEvent | FinalEvent
T = TypeVar("T")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


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
        for i, req in enumerate(requests):
            self.task_ids.append(self.state.task_id())
            if not req.prompt:  # not an error: an empty result
                empty = FinalEvent(StopReason.EOS, Usage(0, 0, 0), Timings(0, 0.0, 0, 0.0, 0))
                self.queue.put_nowait((i, empty))
                continue
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


class IOTimeouts:
    """The `--timeout` seconds as per-operation limits on one HTTP exchange (cpp-httplib's read and write
    timeouts, not a limit on the whole request: a long generation is fine as long as data moves).

    Read: each wait for more of the request body. When it passes, the app sees a disconnect and the client
    gets 408 with `Connection: close`. Write: each send of response data (uvicorn's send waits while the
    client does not read). When it passes, the connection is dropped; the handler's cleanup cancels its
    engine requests. Attribute access goes to the wrapped app (`.state` and the like).
    """

    def __init__(self, app: Any, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.seconds <= 0:
            await self.app(scope, receive, send)
            return
        limit = self.seconds
        flags = {"body_done": False, "started": False, "read_timeout": False, "write_timeout": False}

        async def timed_receive() -> dict[str, Any]:
            if flags["body_done"] or flags["read_timeout"]:
                return await receive()  # only a disconnect comes after the body: no limit on waiting for it
            try:
                msg = await asyncio.wait_for(receive(), limit)
            except TimeoutError:
                flags["read_timeout"] = True
                log.info("read timeout (%s s) on %s %s", limit, scope.get("method"), scope.get("path"))
                return {"type": "http.disconnect"}
            if msg["type"] != "http.request" or not msg.get("more_body", False):
                flags["body_done"] = True
            return msg  # type: ignore[no-any-return]

        async def timed_send(msg: dict[str, Any]) -> None:
            if flags["read_timeout"] or flags["write_timeout"]:
                return  # the exchange is over: this wrapper answers (or drops) it
            if msg["type"] == "http.response.start":
                flags["started"] = True
            try:
                await asyncio.wait_for(send(msg), limit)
            except TimeoutError:
                flags["write_timeout"] = True
                log.info("write timeout (%s s) on %s %s", limit, scope.get("method"), scope.get("path"))
                raise ConnectionAbortedError("the client did not read the response in time") from None

        try:
            await self.app(scope, timed_receive, timed_send)
        except Exception:
            if not (flags["read_timeout"] or flags["write_timeout"]):
                raise
        if flags["read_timeout"] and not flags["started"]:
            body = json.dumps(
                {"error": {"code": 408, "message": "Request timeout", "type": "invalid_request_error"}}
            ).encode()
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            await send({"type": "http.response.start", "status": 408, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
