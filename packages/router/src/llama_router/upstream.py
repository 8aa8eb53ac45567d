"""The proxied path's HTTP/1.1 client: kept-alive connections to children and replicas on asyncio streams.

Every token of a streamed reply crosses the router once, so the client's per-chunk work is the router's
overhead. httpx (httpcore over anyio, h11) spent ~60% of the router's CPU per event in its read path
(cancel scopes, h11 events, several awaits per chunk). Here a chunk of the child's chunked body costs two
reads from an asyncio `StreamReader` (chunks that arrived together are relayed as one piece), and a
request is written in one `write` (head and body together: no second small segment for Nagle to hold).
Connections are reused; a reused one the child closed while idle (its keep-alive timeout) is replaced and
the request sent again once, when nothing of a response came.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

__all__ = ["Upstream", "UpstreamError", "UpstreamResponse", "UpstreamUnreachable"]

_READ = 64 * 1024  # the most one body piece holds (a content-length body or an unframed one)
_HEAD_MAX = 256 * 1024  # a response head larger than this is refused
_NO_BODY = frozenset({204, 304})


class UpstreamError(Exception):
    """The upstream connection failed or broke the protocol (the message is the reason)."""


class UpstreamUnreachable(UpstreamError):
    """The connection could not be opened: the request was not sent."""


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class UpstreamResponse:
    """A response whose body is read as it arrives (`chunks()`); `aclose()` returns or drops the
    connection."""

    def __init__(self, owner: Upstream, key: str, conn: _Conn, status: int, headers: list[tuple[bytes, bytes]],
                 framing: tuple[str, int], keep: bool) -> None:  # fmt: skip
        self.status = status
        self.headers = headers  # raw (name, value) pairs as received
        self._owner, self._key, self._conn = owner, key, conn
        self._framing, self._keep = framing, keep
        self._done = framing[0] == "none"

    def header(self, name: bytes) -> bytes:
        """The first value of header `name` (lower case), b"" when absent."""
        return next((v for k, v in self.headers if k.lower() == name), b"")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive: a chunk of a chunked body, joined with the chunks after it that
        are already here (never waiting for more), so that events that came together leave together."""
        reader = self._conn[0]
        kind, left = self._framing
        try:
            if kind == "chunked":
                while (size := await _chunk_size(reader)) > 0:
                    data = await reader.readexactly(size + 2)  # the chunk and its CRLF
                    more = await _buffered_chunks(reader)
                    yield b"".join([data[:-2], *more]) if more else data[:-2]
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the empty line
                    pass
            elif kind == "length":
                while left > 0:
                    data = await reader.read(min(left, _READ))
                    if not data:
                        raise UpstreamError("connection closed before the end of the body")
                    left -= len(data)
                    yield data
            elif kind == "eof":
                while data := await reader.read(_READ):
                    yield data
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            self._keep = False
            raise UpstreamError(str(e) or type(e).__name__) from None
        self._done = True

    async def aread(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    async def aclose(self) -> None:
        if self._done and self._keep:
            self._owner._release(self._key, self._conn)
        else:
            _close(self._conn)


class Upstream:
    """Kept-alive HTTP/1.1 connections per `scheme://host:port`, opened on demand."""

    def __init__(self, connect_timeout: float = 10.0) -> None:
        self.connect_timeout = connect_timeout
        self._idle: dict[str, list[_Conn]] = {}

    async def request(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes = b""
    ) -> UpstreamResponse:
        """Send a request (`headers` without host, content-length or transfer-encoding) and read the
        response head. Raises UpstreamUnreachable (nothing sent) or UpstreamError."""
        parts = urlsplit(url)
        key = f"{parts.scheme}://{parts.netloc}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = [f"{method} {target} HTTP/1.1\r\nhost: {parts.netloc}\r\n".encode()]
        head += [k + b": " + v + b"\r\n" for k, v in headers]
        if body or method in ("POST", "PUT", "PATCH"):
            head.append(b"content-length: %d\r\n" % len(body))
        data = b"".join(head) + b"\r\n" + body
        for _ in range(2):
            conn, reused = self._idle_conn(key)
            if conn is None:
                conn = await self._connect(parts.scheme, parts.hostname or "", parts.port)
            try:
                conn[1].write(data)
                status, raw, framing, keep = await _read_head(conn[0], method)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
                _close(conn)
                if reused and _nothing_came(e):
                    continue  # the child closed it while idle: once more on a new connection
                raise UpstreamError(str(e) or type(e).__name__) from None
            return UpstreamResponse(self, key, conn, status, raw, framing, keep)
        raise UpstreamError("connection closed without a response")

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                _close(conn)
        self._idle.clear()

    def _idle_conn(self, key: str) -> tuple[_Conn | None, bool]:
        pool = self._idle.get(key, [])
        while pool:
            conn = pool.pop()
            if not conn[0].at_eof() and not conn[1].is_closing():
                return conn, True
            _close(conn)
        return None, False

    def _release(self, key: str, conn: _Conn) -> None:
        if conn[0].at_eof() or conn[1].is_closing() or conn[0]._buffer:  # type: ignore[attr-defined]
            _close(conn)  # closed, or bytes nobody asked for: not reusable
            return
        self._idle.setdefault(key, []).append(conn)

    async def _connect(self, scheme: str, host: str, port: int | None) -> _Conn:
        tls = ssl.create_default_context() if scheme == "https" else None
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(host, port or (443 if tls else 80), ssl=tls, limit=_HEAD_MAX),
                self.connect_timeout,
            )  # asyncio turns Nagle off on its TCP transports
        except (OSError, TimeoutError) as e:
            raise UpstreamUnreachable(str(e) or type(e).__name__) from None


def _nothing_came(e: Exception) -> bool:
    return isinstance(e, (ConnectionError, BrokenPipeError)) or (
        isinstance(e, asyncio.IncompleteReadError) and not e.partial
    )


async def _chunk_size(reader: asyncio.StreamReader) -> int:
    line = await reader.readuntil(b"\r\n")
    return int(line.split(b";", 1)[0].strip(), 16)


async def _buffered_chunks(reader: asyncio.StreamReader) -> list[bytes]:
    """The complete chunks (not the last one) already in `reader`'s buffer, read without waiting: one
    relay write for what one read brought instead of one per event (each write is a syscall that wakes the
    client, and every microsecond of the router is taken from a decode step on a busy machine)."""
    out = []
    while size := _complete_chunk(reader._buffer):  # type: ignore[attr-defined]
        await reader.readuntil(b"\r\n")
        out.append((await reader.readexactly(size + 2))[:-2])
    return out


def _complete_chunk(buf: bytearray) -> int:
    """The size of the chunk at the start of `buf` when all of it (and its CRLF) is there, else 0 (also
    for the last chunk, whose trailers the caller reads)."""
    end = buf.find(b"\r\n", 0, 64)
    if end < 0:
        return 0
    try:
        size = int(bytes(buf[:end]).split(b";", 1)[0].strip(), 16)
    except ValueError:
        return 0  # the caller's own read reports it
    return size if size > 0 and len(buf) >= end + size + 4 else 0


async def _read_head(
    reader: asyncio.StreamReader, method: str
) -> tuple[int, list[tuple[bytes, bytes]], tuple[str, int], bool]:
    """Status, headers, body framing (`chunked`, `length` n, `eof`, `none`) and whether the connection
    can be reused; 1xx interim responses are skipped."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        version, status_text = lines[0].split(b" ", 2)[:2]
        status = int(status_text)
        if 100 <= status < 200 and status != 101:
            continue
        headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(b":") for line in lines[1:])]
        fields = {k.lower(): v.lower() for k, v in headers}
        keep = version == b"HTTP/1.1" and b"close" not in fields.get(b"connection", b"")
        if method == "HEAD" or status in _NO_BODY:
            return status, headers, ("none", 0), keep
        if b"chunked" in fields.get(b"transfer-encoding", b""):
            return status, headers, ("chunked", 0), keep
        if b"content-length" in fields:
            n = int(fields[b"content-length"])
            return status, headers, ("length", n) if n else ("none", 0), keep
        return status, headers, ("eof", 0), False


def _close(conn: _Conn) -> None:
    with contextlib.suppress(Exception):
        conn[1].close()
