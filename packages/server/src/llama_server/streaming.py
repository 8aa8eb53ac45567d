"""The one driver behind every generation API (native, OpenAI completions and chat, Anthropic, Responses).

A handler builds its engine requests and a `Formatter` (one per API: it turns each TokenEvent and
FinalEvent into response Structs and keeps the per-choice state a stream needs), then calls `respond`.

Not streaming: every event is folded into a `Choice` as it arrives; once all are final the formatter
builds the body. Streaming: the first event decides the status (an error there is a JSON error, §0.7);
then each event is formatted as it arrives, in the bridge's one callback per engine step, and its SSE
bytes go into the connection's `Outbox`. The sender task writes whatever is queued in one send, pings
when nothing came for the ping interval, and ends with the formatter's `done` bytes.

`end_streams` (SIGTERM): a stream ends with one error event (503) and `[DONE]` where the API has one,
a non-streamed request answers 503.

A client that stops reading makes uvicorn's `send` wait, so the outbox grows; past `STREAM_BUFFER_BYTES`
its generation is cancelled (the slot is freed), the queued bytes are dropped and the connection is
closed. A client that disconnects cancels the generation too.

With `X-Conversation-Id` (resumable.py) the stream is detached from its connection: a `SessionOutbox`
appends every byte to the conversation's session first, and the socket is just one reader of that
session. A disconnect then stops only the sending; the generation goes on into the session until it ends
or the session is cancelled (DELETE, a newer request with the same id, shutdown). A request that does not
stream, or fails before its stream starts, leaves no session behind.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ClassVar

import msgspec
from litestar import Request, Response
from litestar.response import Stream
from llama_tools.auth import key_scope

from llama_engine import FinalEvent, GenerationRequest, ProgressEvent, StopReason, TokenEvent
from llama_engine.tokenizer import Tokenizer

from .bridge import Event, Run, Wakeup, resolve, until_disconnect
from .config import ServerConfig
from .controllers._common import json_response
from .errors import ApiError
from .generation import Choice, ErrorBody, ErrorObject, Probs, error_of, prob_entry
from .params import GenParams
from .resumable import OffsetLost, Reader, Session, close_all, header_id, short_id
from .sse import PING, event, write_event
from .state import ServerState

__all__ = [
    "STREAM_BUFFER_BYTES",
    "EventStream",
    "Formatter",
    "Outbox",
    "Replay",
    "SessionOutbox",
    "end_streams",
    "ping_seconds",
    "respond",
]

log = logging.getLogger("llama_server")

STREAM_BUFFER_BYTES = 4 << 20  # SSE bytes one connection may have waiting for its client


class Formatter:
    """One request's response in one API's shape. `token` / `final` return the stream events for one
    engine event (Structs, in order); `result` the non-streamed body from the collected choices."""

    named: ClassVar[bool] = False  # `event: <tag>` lines (Anthropic, Responses)
    done: ClassVar[bytes] = b""  # the stream's last bytes after the final events (`data: [DONE]`)

    def __init__(self, tok: Tokenizer, n_probs: int = 0, post: bool = False, special: bool = False) -> None:
        self.tok = tok
        self.n_probs = n_probs
        self.post = post
        self.special = special  # `-sp`: special tokens' pieces in the probabilities too

    def probs(self, ev: TokenEvent) -> Probs | None:
        """This token's probability entry, when the request asked for them."""
        return prob_entry(self.tok, ev, self.post, self.special) if self.n_probs > 0 and ev.top else None

    def opening(self) -> Iterable[msgspec.Struct]:
        """Events before the first engine event."""
        return ()

    def token(self, index: int, ev: TokenEvent) -> Iterable[msgspec.Struct]:
        raise NotImplementedError

    def final(self, index: int, ev: FinalEvent) -> Iterable[msgspec.Struct]:
        raise NotImplementedError

    def progress(self, index: int, ev: ProgressEvent) -> Iterable[msgspec.Struct]:
        """Events for a prompt-progress update (`return_progress`); none in APIs without them."""
        return ()

    def closing(self) -> Iterable[msgspec.Struct]:
        """Events after every choice's final ones."""
        return ()

    def error(self, err: ErrorObject) -> bytes:
        """The last event of a stream that failed after it started (OAI form: the object wrapped)."""
        return event(ErrorBody(err))

    def result(self, choices: list[Choice]) -> Any:
        raise NotImplementedError


def ping_seconds(body: GenParams, config: ServerConfig) -> float | None:
    """The keep-alive interval: the request's `sse_ping_interval`, else the server's; <= 0 turns it off."""
    v = body.sse_ping_interval if body.sse_ping_interval is not None else config.sse_ping_interval
    return float(v) if v and v > 0 else None


async def respond(
    request: Request[Any, Any, Any],
    state: ServerState,
    reqs: list[GenerationRequest],
    fmt: Formatter,
    body: GenParams,
    on_submit: Callable[[Run], None] | None = None,
) -> Response[Any]:
    """Submit `reqs` (one per prompt and choice) and answer: the formatter's body once every request is
    final, or (`body.stream`) an SSE stream of its events. With `X-Conversation-Id` the stream is written
    to that conversation's session (replacing the previous one) and outlives its connection."""
    conv_id = header_id(request.headers.get("x-conversation-id", ""))
    scope = key_scope(state.config.api_keys, request.headers)  # the session is the caller's key's
    if scope:  # and so is the cache its prompts reuse and fill
        reqs = [msgspec.structs.replace(r, cache_scope=scope) for r in reqs]
    session = state.streams.create(conv_id, state.config, scope) if conv_id else None
    try:
        run = Run(state)
        run.submit_all(reqs)
        if on_submit is not None:  # e.g. the control route's table of running chat completions
            on_submit(run)
        if not body.stream:
            return await _collect(request, run, fmt)
        ping = ping_seconds(body, state.config)
        if session is None:
            await run.check_first(request.receive)
            outbox = Outbox(run, fmt)
        else:
            # the generation no longer depends on the connection: only a cancelled session stops the wait
            await run.check_first(_until_finalized(session))
            outbox = SessionOutbox(run, fmt, session, ping, state)
            log.info("stream %s attached", short_id(conv_id))
        run.attach(outbox.add)
        session = None  # it streams: the session stays for lookup and replay
        return EventStream(outbox, ping)
    finally:
        if session is not None:  # not streamed, or failed before the stream started: nothing to replay
            state.streams.evict(session)


def _until_finalized(session: Session) -> Callable[[], Awaitable[dict[str, str]]]:
    """An ASGI `receive` that reports a disconnect once the session is cancelled or finalised."""

    async def receive() -> dict[str, str]:
        while not session.done:
            await session.changed(None)
        return {"type": "http.disconnect"}

    return receive


async def _collect(request: Request[Any, Any, Any], run: Run, fmt: Formatter) -> Response[Any]:
    """A non-streamed answer: every event folded into its choice, the body once all are final."""
    collector = _Collector(run, fmt)
    run.attach(collector.add)
    _open.add(collector)
    try:
        await until_disconnect(request.receive, collector.done, run)
    finally:
        _open.discard(collector)
    if collector.drained is not None:
        raise ApiError(collector.drained, "unavailable_error")
    error = error_of(c.final for c in collector.choices)
    if error is not None:
        raise ApiError(error, "server_error")
    return json_response(fmt.result(collector.choices))


_open: weakref.WeakSet[_Collector | Outbox] = weakref.WeakSet()  # what end_streams ends


def end_streams(message: str) -> int:
    """End every open response (SIGTERM): a stream with one error event (503 `unavailable_error`) and
    `[DONE]` where its API has one, a non-streamed request with a 503 JSON error; their generations are
    cancelled. Then every resumable session is finalised, so no reader waits for more. Returns how many
    responses there were. On the event loop only."""
    responses = list(_open)
    for r in responses:
        r.drain(message)
    close_all()
    return len(responses)


class _Collector:
    """A non-streamed run: every event folded into its `Choice`; `done` once all are final."""

    def __init__(self, run: Run, fmt: Formatter) -> None:
        self.run = run
        self.fmt = fmt
        self.choices = [Choice(i) for i in range(run.n)]
        self.remaining = run.n
        self.done: asyncio.Future[None] = run.loop.create_future()
        self.drained: str | None = None

    def add(self, index: int, ev: Event) -> None:
        if isinstance(ev, ProgressEvent):  # a stream's events only
            return
        self.choices[index].add(ev, self.fmt.probs(ev) if isinstance(ev, TokenEvent) else None)
        if isinstance(ev, FinalEvent):
            self.remaining -= 1
            if not self.remaining:
                resolve(self.done)

    def drain(self, message: str) -> None:
        """The server is stopping: answer 503 now, the generation cancelled."""
        self.drained = message
        self.run.cancel()
        resolve(self.done)


class _Sender:
    """The sending side of an SSE response: `pump` writes what `take` returns to the socket, in one send
    each, until it returns None, the client disconnects or the stream is cut (`overflowed`)."""

    def __init__(self) -> None:
        self.overflowed = False  # cut: the connection closes without the body's last chunk
        self._sender: asyncio.Task[Any] | None = None
        self._interrupted = False

    async def take(self, ping: float | None) -> bytes | None:
        raise NotImplementedError

    async def pump(self, send: Any, receive: Any, ping: float | None) -> None:
        """Send the stream until it ends, the client disconnects or the outbox overflows."""
        sender = self._sender = asyncio.current_task()
        assert sender is not None
        watch = asyncio.ensure_future(_wait_disconnect(receive))
        watch.add_done_callback(self._hang_up)
        try:
            while (data := await self.take(ping)) is not None:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            if not self.overflowed:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not self._interrupted:
                raise
            sender.uncancel()
        finally:
            self._sender = None
            watch.cancel()
            self._release()

    def _release(self) -> None:
        """The connection is done with (ended, cut or disconnected)."""

    def _hang_up(self, watch: asyncio.Future[None]) -> None:
        if not watch.cancelled():  # the client disconnected (or its receive failed: the same for us)
            watch.exception()
            self._interrupt()

    def _interrupt(self) -> None:
        """Stop the sender wherever it waits (for an event, or in a send the client does not read)."""
        if self._sender is not None and not self._interrupted:
            self._interrupted = True
            self._sender.cancel()


class Outbox(_Sender):
    """The SSE bytes of one stream that wait for the socket, at most `limit` of them."""

    def __init__(self, run: Run, fmt: Formatter, limit: int = STREAM_BUFFER_BYTES) -> None:
        self.run = run
        self.fmt = fmt
        self.limit = limit
        self.buf = bytearray()
        self.ended = False  # nothing more will be queued
        super().__init__()
        self._remaining = run.n
        self._wakeup = Wakeup(run.loop)
        self._write(fmt.opening())
        _open.add(self)

    # the producer side: the event loop, one call per engine event in arrival order

    def add(self, index: int, ev: Event) -> None:
        if self.ended:
            return
        try:
            if isinstance(ev, TokenEvent):
                self._write(self.fmt.token(index, ev))
            elif isinstance(ev, ProgressEvent):
                self._write(self.fmt.progress(index, ev))
            elif ev.reason == StopReason.ERROR:
                self.end(self.fmt.error(ErrorObject(500, ev.error or "generation failed", "server_error")))
            else:
                self._write(self.fmt.final(index, ev))
                self._remaining -= 1
                if not self._remaining:
                    self._write(self.fmt.closing())
                    self.end(self.fmt.done)
        except Exception as e:  # a formatting failure ends this stream, not the others in the same step
            log.exception("stream formatting failed")
            self.end(self.fmt.error(ErrorObject(500, f"internal error: {e}", "server_error")))
        if len(self.buf) > self.limit:
            self._overflow()
        self._wakeup.set()

    def end(self, last: bytes = b"") -> None:
        """Queue `last` as the stream's last bytes and cancel what still runs (other choices)."""
        if self.ended:
            return
        self.buf += last
        self.ended = True
        _open.discard(self)
        self.run.cancel()
        self._wakeup.set()

    def drain(self, message: str) -> None:
        """The server is stopping: one final error event (and `[DONE]` where the API has one), then the
        stream ends; its generation is cancelled."""
        self.end(self.fmt.error(ErrorObject(503, message, "unavailable_error")) + self.fmt.done)

    def _write(self, frames: Iterable[msgspec.Struct]) -> None:
        named = self.fmt.named
        for f in frames:
            write_event(self.buf, f, named)

    def _overflow(self) -> None:
        log.warning(
            "a client is not reading its stream: %d bytes queued (limit %d); generation cancelled, "
            "connection closed",
            len(self.buf),
            self.limit,
        )
        self.overflowed = True
        self.buf.clear()
        self.end()
        self._interrupt()

    # the consumer side: the response's sender task

    async def take(self, ping: float | None) -> bytes | None:
        """Everything queued; PING after `ping` seconds without an event; None once the stream is over."""
        if not self.buf:
            if self.ended:
                return None
            await self._wakeup.wait(ping)
            if not self.buf:
                return None if self.ended else PING
        data = bytes(self.buf)
        self.buf.clear()
        return data

    def _release(self) -> None:
        """The connection is done with: the generation has no other consumer, so it ends."""
        self.end()


class SessionOutbox(Outbox):
    """An outbox whose bytes go into a resumable session as they are produced (before any socket write);
    the connection reads them back from the session like any `GET /v1/stream` reader. Pings are produced
    here too (when nothing came for the ping interval), so a replay holds the ones sent live."""

    def __init__(
        self, run: Run, fmt: Formatter, session: Session, ping: float | None, state: ServerState
    ) -> None:
        self.session = session
        self.reader = Reader(session, 0, state.config.stream_reader_wake, state.streams)
        self.ping = ping
        self._ping_timer: asyncio.TimerHandle | None = None
        self._last = run.loop.time()
        super().__init__(run, fmt, sys.maxsize)  # the session's cap bounds what is kept, not this outbox
        session.on_cancel = self.stop
        self._flush()
        self._arm_ping(ping)

    def add(self, index: int, ev: Event) -> None:
        super().add(index, ev)
        self._flush()

    def end(self, last: bytes = b"") -> None:
        if self.ended:
            return
        super().end(last)
        self._flush()
        self._finish()

    def stop(self) -> None:
        """The session was cancelled: the stream ends where it is (no final event) and so does the
        generation."""
        if self.ended:
            return
        self.buf.clear()
        super().end()
        self._finish()

    async def take(self, ping: float | None) -> bytes | None:
        return await _follow(self, self.reader)

    def _release(self) -> None:
        pass  # a disconnect does not stop a resumable generation

    def _flush(self) -> None:
        if self.buf:
            self.session.append(self.buf)
            self.buf.clear()
            self._last = self.run.loop.time()

    def _finish(self) -> None:
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None
        self.session.on_cancel = None
        self.session.finalize()

    def _arm_ping(self, delay: float | None) -> None:
        if delay is not None and not self.ended:
            self._ping_timer = self.run.loop.call_later(delay, self._ping_due)

    def _ping_due(self) -> None:
        assert self.ping is not None
        idle = self.run.loop.time() - self._last
        if idle >= self.ping:
            self.session.append(PING)
            self._last = self.run.loop.time()
            idle = 0.0
        self._arm_ping(self.ping - idle)


class Replay(_Sender):
    """`GET /v1/stream`: one reader of a session; its disconnect changes nothing for the generation."""

    def __init__(self, reader: Reader) -> None:
        super().__init__()
        self.reader = reader

    async def take(self, ping: float | None) -> bytes | None:
        return await _follow(self, self.reader)


async def _follow(sender: _Sender, reader: Reader) -> bytes | None:
    """The reader's next bytes; a reader that fell behind the session's cap is cut (its offset is lost:
    it can only start over)."""
    try:
        return await reader.next()
    except OffsetLost:
        log.warning("a client is not reading its stream: it fell behind the replay buffer; connection closed")
        sender.overflowed = True
        return None


async def _wait_disconnect(receive: Any) -> None:
    while (await receive()).get("type") != "http.disconnect":
        pass


class EventStream(Stream):
    """`text/event-stream` response whose body comes from an `Outbox` (or a `Replay`)."""

    def __init__(self, outbox: _Sender, ping: float | None) -> None:
        super().__init__(
            (),
            media_type="text/event-stream",
            headers={"X-Accel-Buffering": "no", "Cache-Control": "no-cache"},
        )
        self.outbox = outbox
        self.ping = ping

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        return _EventStreamASGI(super().to_asgi_response(*args, **kwargs), self.outbox, self.ping)


class _EventStreamASGI:
    """Litestar's response start (headers, cookies, status), then the outbox as the body."""

    __slots__ = ("base", "outbox", "ping")

    def __init__(self, base: Any, outbox: _Sender, ping: float | None) -> None:
        self.base = base
        self.outbox = outbox
        self.ping = ping

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.base.start_response(send)
        await self.outbox.pump(send, receive, self.ping)
        await self.base.after_response()
