"""Resumable streams: the per-conversation replay buffers behind `X-Conversation-Id` (streams-and-tools.md §1).

A generating request that carries the header gets a `Session` from the server's `SessionStore`: every SSE
byte its stream produces is appended to the session before it goes to the socket, so any client can
re-attach later with `GET /v1/stream?conv_id=ID&from=N` and get exactly the bytes from offset N on, then
the live ones. One live session per id: creating one cancels and finalises the previous. A finished session
is kept `stream_session_ttl` seconds (300) and collected by a sweep every `stream_gc_interval` (60);
readers wake every `stream_reader_wake` (0.2) to notice a shutdown; `close_all` (SIGTERM) finalises every
session so no reader waits forever.

Sessions are scoped: each belongs to the API key it was created under (`llama_tools.auth.key_scope`, ""
without keys), and every lookup, replay and stop sees only its caller's scope, so with several keys one
client cannot list, read, replace or cancel another's streams even if it learns an id.

Everything here runs on the event loop (the producer is the bridge's per-step callback, readers and the
routes are coroutines), so there are no locks.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Protocol

__all__ = [
    "SESSION_BYTES",
    "OffsetLost",
    "Reader",
    "Session",
    "SessionStore",
    "StreamSettings",
    "close_all",
    "header_id",
    "short_id",
]

log = logging.getLogger("llama_server")

SESSION_BYTES = 4 * 1024 * 1024  # the ring buffer cap of one session (llama.cpp's STREAM_SESSION_MAX_BYTES)


class StreamSettings(Protocol):
    """The settings a store reads (ServerConfig has them)."""

    @property
    def stream_session_bytes(self) -> int: ...
    @property
    def stream_session_ttl(self) -> float: ...
    @property
    def stream_gc_interval(self) -> float: ...
    @property
    def stream_reader_wake(self) -> float: ...


class OffsetLost(Exception):
    """The offset asked for is below the session's dropped prefix: those bytes are gone."""


def header_id(value: str) -> str:
    """The conversation id of an `X-Conversation-Id` value, as the text its URL-encoded form in a query
    string decodes to: header bytes reach us decoded as latin-1, a client writes the id in UTF-8."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:  # not UTF-8 (or not from the wire): the id as given
        return value


def short_id(conv_id: str) -> str:
    """What a log line may show of a conversation id: ids are capabilities, never logged in full."""
    return conv_id[:4] + "…" if len(conv_id) > 4 else "…"


class Session:
    """The SSE bytes of one generation, at absolute offsets since it started; at most `cap` kept."""

    def __init__(self, conv_id: str, cap: int = SESSION_BYTES, scope: str = "") -> None:
        self.conv_id = conv_id
        self.scope = scope  # the API key's scope it was created under
        self.cap = cap
        self.started_at = int(time.time())
        self.completed_at = 0  # unix seconds once finalised
        self.dropped = 0  # bytes discarded from the front (the cap)
        self.done = False
        self.cancelled = False
        # what cancelling stops: the producing request's generation (set by the stream driver)
        self.on_cancel: Callable[[], None] | None = None
        self._buf = bytearray()
        self._changed: asyncio.Future[None] | None = None

    @property
    def total_bytes(self) -> int:
        """Every byte that ever entered the session (offsets grow forever)."""
        return self.dropped + len(self._buf)

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Add the next bytes of the stream, dropping the oldest beyond the cap; ignored once finalised."""
        n = len(data)
        if self.done or not n:
            return
        if n >= self.cap:  # one chunk larger than the whole buffer: only its tail fits
            self.dropped += len(self._buf) + n - self.cap
            self._buf[:] = data[n - self.cap :]
        else:
            excess = len(self._buf) + n - self.cap
            if excess > 0:
                del self._buf[:excess]  # CPython moves the bytearray's start: no copy of the rest
                self.dropped += excess
            self._buf += data
        self._notify()

    def read(self, offset: int) -> bytes:
        """The bytes from `offset` to the current end (empty when there are none yet)."""
        if offset < self.dropped:
            raise OffsetLost(offset)
        return bytes(self._buf[offset - self.dropped :]) if offset < self.total_bytes else b""

    def finalize(self) -> None:
        """No more bytes will come: mark done, record the completion time, wake the readers. Idempotent."""
        if self.done:
            return
        self.done = True
        self.completed_at = int(time.time())
        self._notify()

    def cancel(self) -> None:
        """Stop the producing generation (DELETE, replacement, shutdown) and finalise."""
        if not self.cancelled:
            self.cancelled = True
            stop, self.on_cancel = self.on_cancel, None
            if stop is not None:
                stop()
        self.finalize()

    async def changed(self, timeout: float | None) -> None:
        """Until bytes are appended or the session is finalised, or `timeout` seconds pass."""
        if self.done:
            return
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        await asyncio.wait((self._changed,), timeout=timeout)  # never cancels the shared future

    def _notify(self) -> None:
        waiter, self._changed = self._changed, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Reader:
    """One client following a session from an offset: the buffered bytes, then the live ones."""

    def __init__(self, session: Session, offset: int, wake: float | None, store: SessionStore | None) -> None:
        self.session = session
        self.offset = offset
        self.wake = wake
        self.store = store

    async def next(self) -> bytes | None:
        """The bytes available past the offset (waiting for some); None at the end of the stream.
        Raises `OffsetLost` when the reader fell below the dropped prefix."""
        while True:
            data = self.session.read(self.offset)
            if data:
                self.offset += len(data)
                return data
            if self.session.done or (self.store is not None and self.store.closed):
                return None
            await self.session.changed(self.wake)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (data := await self.next()) is not None:
            yield data


_stores: weakref.WeakSet[SessionStore] = weakref.WeakSet()  # what close_all finalises


class SessionStore:
    """The live sessions of one server, keyed by (scope, conversation id). There is deliberately no way to
    list them: `lookup` answers only for the ids it is given, and only in the caller's scope."""

    def __init__(self) -> None:
        self.sessions: dict[tuple[str, str], Session] = {}
        self.closed = False
        self.ttl = 300.0
        self.gc_interval = 60.0
        self._sweep: asyncio.TimerHandle | None = None
        _stores.add(self)

    def create(self, conv_id: str, settings: StreamSettings, scope: str = "") -> Session:
        """A fresh session for `conv_id` in `scope`, replacing (cancelling and finalising) the previous one
        of that scope (another scope's session of the same id is left alone)."""
        session = Session(conv_id, settings.stream_session_bytes, scope)
        self.ttl, self.gc_interval = settings.stream_session_ttl, settings.stream_gc_interval
        previous = self.sessions.get((scope, conv_id))
        self.sessions[scope, conv_id] = session
        if previous is not None:
            log.info("stream %s replaced: the previous generation is cancelled", short_id(conv_id))
            previous.cancel()
        if self.closed:  # shutting down: nothing will follow it
            session.finalize()
        self._schedule_sweep()
        return session

    def get(self, conv_id: str, scope: str = "") -> Session | None:
        return self.sessions.get((scope, conv_id))

    def evict(self, session: Session) -> None:
        """Remove `session` (a request that did not stream) unless a newer one took its id; finalise it."""
        key = (session.scope, session.conv_id)
        if self.sessions.get(key) is session:
            del self.sessions[key]
        session.finalize()

    def stop(self, conv_id: str, scope: str = "") -> bool:
        """DELETE: remove the session, cancel its generation, finalise it. False when there was none."""
        session = self.sessions.pop((scope, conv_id), None)
        if session is None:
            return False
        session.cancel()
        return True

    def lookup(self, ids: list[str], scope: str = "") -> list[Session]:
        """The sessions of `scope` whose id equals a requested one or starts with `<id>::` (per-model
        variants), in request order; an id matching several returns them all, duplicates kept (as
        llama.cpp)."""
        out: list[Session] = []
        for rid in ids:
            variant = rid + "::"
            out += [
                s
                for (sc, cid), s in self.sessions.items()
                if sc == scope and (cid == rid or cid.startswith(variant))
            ]
        return out

    def collect(self, now: float | None = None) -> int:
        """Remove the sessions that finished at least `ttl` seconds ago; running ones always stay."""
        cutoff = (time.time() if now is None else now) - self.ttl
        expired = [key for key, s in self.sessions.items() if s.completed_at and s.completed_at <= cutoff]
        for key in expired:
            self.sessions.pop(key).finalize()
        return len(expired)

    def close(self) -> None:
        """Shutdown: no more sweeps, every session finalised (its readers reach the end) and dropped."""
        self.closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        sessions, self.sessions = list(self.sessions.values()), {}
        for s in sessions:
            s.finalize()

    def _schedule_sweep(self) -> None:
        # a timer, not a task: it reschedules itself while there are sessions, so an idle server has
        # none pending and a stopped event loop leaves nothing behind
        if self._sweep is None and not self.closed:
            loop = asyncio.get_running_loop()
            self._sweep = loop.call_later(self.gc_interval, self._run_sweep)

    def _run_sweep(self) -> None:
        self._sweep = None
        n = self.collect()
        if n:
            log.info("%d finished stream(s) expired", n)
        if self.sessions:
            self._schedule_sweep()


def close_all() -> int:
    """Close every store of this process (SIGTERM's drain); returns how many sessions were finalised."""
    n = 0
    for store in list(_stores):
        n += len(store.sessions)
        store.close()
    return n
