"""The relay's HTTP/1.1 client against a loopback server that answers exactly what each test sends: chunked,
sized, unframed and bodyless responses, kept-alive reuse, a connection the server closed while idle, a
body cut short, and an address nobody listens on."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from llama_router.upstream import Upstream, UpstreamError, UpstreamUnreachable

Reply = Callable[[asyncio.StreamWriter, int], Awaitable[bool]]  # (writer, request number) -> keep open


async def _serve(reply: Reply) -> tuple[asyncio.Server, str, list[bytes]]:
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                               if k.lower() == b"content-length"), 0)  # fmt: skip
                seen.append(head + await reader.readexactly(length))
                if not await reply(writer, len(seen)):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen


def _run(reply: Reply, body: Callable[[Upstream, str, list[bytes]], Awaitable[None]]) -> None:
    async def main() -> None:
        server, url, seen = await _serve(reply)
        up = Upstream()
        try:
            await body(up, url, seen)
        finally:
            await up.aclose()
            server.close()

    asyncio.run(main())


async def _chunked(w: asyncio.StreamWriter, n: int) -> bool:
    w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for piece in (b"data: a\n\n", b"data: bb\n\n"):
        w.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
        await w.drain()
    w.write(b"0\r\nx-trailer: t\r\n\r\n")
    return True


def test_chunked_pieces_and_reuse() -> None:
    async def body(up: Upstream, url: str, seen: list[bytes]) -> None:
        for _ in range(3):
            r = await up.request("POST", url + "/completion?x=1", [(b"x-a", b"1")], b'{"n":1}')
            assert r.status == 200 and r.header(b"content-type") == b"text/event-stream"
            assert b"".join([c async for c in r.chunks()]) == b"data: a\n\ndata: bb\n\n"
            await r.aclose()
        assert len(seen) == 3  # one connection for all three
        assert seen[0].startswith(b"POST /completion?x=1 HTTP/1.1\r\nhost: 127.0.0.1:")
        assert b'\r\nx-a: 1\r\ncontent-length: 7\r\n\r\n{"n":1}' in seen[0]
        assert len(up._idle[url]) == 1

    _run(_chunked, body)


def test_chunks_that_came_together_leave_together_and_none_waits() -> None:
    gate = asyncio.Event()

    async def reply(w: asyncio.StreamWriter, n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        w.write(b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (b"data: 1\n\n", b"data: 22\n\n")))
        w.write(b"b\r\ndata: 333")  # the start of a third chunk: not relayed before the rest of it comes
        await w.drain()
        await gate.wait()  # the next chunk is sent only once the first two were relayed
        w.write(b"\n\n\r\n0\r\n\r\n")
        return True

    async def body(up: Upstream, url: str, seen: list[bytes]) -> None:
        r = await up.request("GET", url + "/x", [])
        pieces = r.chunks()
        await asyncio.sleep(0.05)  # the first two chunks and part of the third are in the buffer
        assert await anext(pieces) == b"data: 1\n\ndata: 22\n\n"
        gate.set()
        assert [c async for c in pieces] == [b"data: 333\n\n"]
        await r.aclose()
        assert len(up._idle[url]) == 1

    _run(reply, body)


def test_sized_unframed_and_bodyless() -> None:
    async def reply(w: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:
            w.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 5\r\n\r\nhello")
        elif n == 2:
            w.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        else:
            w.write(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")
            return False
        return True

    async def body(up: Upstream, url: str, seen: list[bytes]) -> None:
        r = await up.request("GET", url + "/a", [])
        assert (r.status, await r.aread()) == (201, b"hello")
        await r.aclose()
        r = await up.request("DELETE", url + "/b", [])
        assert (r.status, await r.aread()) == (204, b"")
        await r.aclose()
        r = await up.request("GET", url + "/c", [])
        assert (r.status, await r.aread()) == (200, b"until the end")
        await r.aclose()
        assert not up._idle.get(url)  # an unframed body ends the connection
        assert b"content-length" not in seen[0]  # a GET without a body sends none

    _run(reply, body)


def test_a_connection_closed_while_idle_is_replaced_once() -> None:
    async def reply(w: asyncio.StreamWriter, n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        return False  # close after every answer, as a keep-alive timeout would

    async def body(up: Upstream, url: str, seen: list[bytes]) -> None:
        for pause in (0, 0.05, 0, 0):  # reused before or after the close was seen
            r = await up.request("POST", url + "/x", [], b"{}")
            assert await r.aread() == b"ok"
            await r.aclose()
            await asyncio.sleep(pause)
        assert len(seen) == 4

    _run(reply, body)


def test_a_body_cut_short_is_an_error() -> None:
    async def reply(w: asyncio.StreamWriter, n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n8\r\nhal")
        return False

    async def body(up: Upstream, url: str, seen: list[bytes]) -> None:
        r = await up.request("POST", url + "/x", [], b"{}")
        got = []
        with pytest.raises(UpstreamError):
            async for c in r.chunks():
                got.append(c)
        assert got == [b"hello"]
        await r.aclose()
        assert not up._idle.get(url)

    _run(reply, body)


def test_nobody_listening_is_unreachable() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def main() -> None:
        with pytest.raises(UpstreamUnreachable):
            await Upstream().request("POST", f"http://127.0.0.1:{port}/x", [], b"{}")

    asyncio.run(main())
