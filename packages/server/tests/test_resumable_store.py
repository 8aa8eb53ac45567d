"""The session store on its own (no model): the 4 MiB ring buffer and its dropped prefix, readers, replacement,
expiry, shutdown; and the stream driver's session side fed real engine events (pings are buffered)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import smollm2_path

import gguf_io
from llama_engine import FinalEvent, StopReason, Timings, TokenEvent, Usage
from llama_engine.tokenizer import Tokenizer
from llama_server import ServerConfig, ServerState
from llama_server.bridge import Run
from llama_server.formats import CompletionsFormatter
from llama_server.resumable import (
    SESSION_BYTES,
    OffsetLost,
    Reader,
    Session,
    SessionStore,
    close_all,
    header_id,
)
from llama_server.sse import PING
from llama_server.streaming import Replay, SessionOutbox, end_streams

MIB = 1024 * 1024
CFG = ServerConfig(model="m.gguf")


def test_defaults_are_llama_cpps_constants():
    assert SESSION_BYTES == 4 * MIB == CFG.stream_session_bytes
    assert (CFG.stream_session_ttl, CFG.stream_gc_interval, CFG.stream_reader_wake) == (300.0, 60.0, 0.2)


def test_ring_buffer_keeps_the_last_4_mib_at_absolute_offsets():
    s = Session("c")
    part = bytes(range(256)) * (MIB // 256)  # 1 MiB with a recognisable pattern
    for _ in range(3):
        s.append(part)
    assert (s.dropped, s.total_bytes) == (0, 3 * MIB)
    s.append(part + part[:10])  # 4 MiB + 10: the 10 oldest bytes go
    assert (s.dropped, s.total_bytes) == (10, 4 * MIB + 10)
    with pytest.raises(OffsetLost):
        s.read(9)
    assert s.read(10) == (part * 4)[10:] + part[:10]
    assert s.read(4 * MIB + 5) == part[5:10]
    assert s.read(4 * MIB + 10) == b"" == s.read(10**12)  # at or past the end: nothing yet
    big = b"x" * (5 * MIB)  # one append larger than the cap: only its last 4 MiB stay
    s.append(big)
    assert s.dropped == 4 * MIB + 10 + MIB and s.total_bytes == 9 * MIB + 10
    assert s.read(s.dropped) == b"x" * (4 * MIB)
    s.finalize()
    s.append(b"late")  # ignored once finalised
    assert s.total_bytes == 9 * MIB + 10 and s.done and s.completed_at >= s.started_at


def test_a_small_cap_drops_exactly_the_excess():
    s = Session("c", cap=8)
    s.append(b"abcde")
    s.append(b"fghij")
    assert (s.dropped, s.read(2)) == (2, b"cdefghij")
    s.append(b"0123456789")
    assert (s.dropped, s.read(12)) == (12, b"23456789")


def test_readers_follow_live_bytes_and_end_at_finalisation():
    async def main() -> list[bytes]:
        s = Session("c")
        got: list[bytes] = []

        async def read(offset: int) -> None:
            async for chunk in Reader(s, offset, 0.01, None):
                got.append(chunk)

        task = asyncio.ensure_future(read(3))  # past the end: waits until bytes reach it
        await asyncio.sleep(0.02)
        s.append(b"ab")
        await asyncio.sleep(0.02)
        s.append(b"cdef")
        await asyncio.sleep(0.02)
        s.finalize()
        await asyncio.wait_for(task, 1)
        return got

    assert b"".join(asyncio.run(main())) == b"def"


def test_store_replaces_stops_evicts_and_looks_up_by_id_only():
    async def main() -> None:
        store = SessionStore()
        cancelled: list[str] = []
        a = store.create("a", CFG)
        a.on_cancel = lambda: cancelled.append("a")
        a2 = store.create("a", CFG)  # replaces: the first is cancelled and finalised
        assert cancelled == ["a"] and a.done and a.cancelled and store.get("a") is a2
        store.evict(a)  # an older session never removes the newer one
        assert store.get("a") is a2
        b = store.create("a::org/m", CFG)
        store.create("ab", CFG)
        assert store.lookup(["a"]) == [a2, b] and store.lookup(["a::"]) == [] and store.lookup([]) == []
        assert store.stop("a") and not store.stop("a") and a2.cancelled and store.get("a") is None
        store.close()

    asyncio.run(main())


def test_sessions_are_scoped_by_key():
    async def main() -> None:
        store = SessionStore()
        mine, theirs = store.create("c", CFG, "k1"), store.create("c", CFG, "k2")  # no replacement
        open_ = store.create("c::m", CFG)  # no keys: the "" scope
        assert not mine.done and store.get("c", "k1") is mine and store.get("c", "k2") is theirs
        assert store.get("c") is None and store.lookup(["c"], "k1") == [mine]
        assert store.lookup(["c"]) == [open_] and store.lookup(["c"], "k3") == []
        assert not store.stop("c", "k3") and not mine.cancelled
        assert store.stop("c", "k2") and theirs.cancelled and store.get("c", "k1") is mine
        store.evict(mine)
        assert store.get("c", "k1") is None and store.get("c::m") is open_
        store.close()

    asyncio.run(main())


def test_expiry_counts_from_completion_and_spares_running_sessions():
    async def main() -> None:
        store = SessionStore()
        done, running = store.create("done", CFG), store.create("running", CFG)
        done.finalize()
        assert store.collect(now=done.completed_at + 299) == 0
        assert store.collect(now=done.completed_at + 300) == 1
        assert store.get("done") is None and store.get("running") is running
        assert store.collect(now=running.started_at + 10**6) == 0
        store.close()

    asyncio.run(main())


def test_the_sweep_runs_on_its_interval():
    fast = ServerConfig(model="m.gguf", stream_session_ttl=0.0, stream_gc_interval=0.05)

    async def main() -> None:
        store = SessionStore()
        store.create("x", fast).finalize()
        await asyncio.sleep(0.3)
        assert store.get("x") is None and store._sweep is None  # nothing left: no timer pending
        store.close()

    asyncio.run(main())


def test_close_finalises_every_session_and_wakes_readers():
    async def main() -> None:
        store = SessionStore()
        s = store.create("x", CFG)
        reader = asyncio.ensure_future(Reader(s, 0, 0.05, store).next())
        await asyncio.sleep(0.02)
        assert close_all() >= 1
        assert await asyncio.wait_for(reader, 1) is None and s.done and store.get("x") is None
        # a session created after the close is finalised at once: nothing would ever end it
        assert store.create("y", CFG).done

    asyncio.run(main())


# -- the driver's session side, with real engine events ------------------------------------------------------

TIMINGS = Timings(3, 1.0, 2, 1.0, 0)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    with gguf_io.open(smollm2_path()) as f:
        return Tokenizer.from_gguf(f.tokenizer)


def _outbox(tok: Tokenizer, ping: float | None) -> tuple[Run, SessionOutbox, Session]:
    state = ServerState(ServerConfig(model="m.gguf"))
    run = Run(state)
    run.n, run.task_ids = 1, [0]
    session = state.streams.create("c", state.config)
    fmt = CompletionsFormatter(tok, id="c", created=1, model="m", n_probs=0, post=False)
    outbox = SessionOutbox(run, fmt, session, ping, state)
    run.attach(outbox.add)
    return run, outbox, session


def _token(tok: Tokenizer, text: str) -> TokenEvent:
    return TokenEvent(tok.encode(text, add_special=False)[0], text)


def test_pings_go_into_the_session(tok):
    async def main() -> bytes:
        run, _, session = _outbox(tok, 0.05)
        run._deliver((0, _token(tok, "Hi")))
        await asyncio.sleep(0.13)  # two ping intervals without an event
        run._deliver((0, FinalEvent(StopReason.LENGTH, Usage(3, 1), TIMINGS, slot=0)))
        assert session.done
        return session.read(0)

    raw = asyncio.run(main())
    assert raw.count(PING) == 2 and raw.index(PING) > raw.index(b'"Hi"') and raw.endswith(b"data: [DONE]\n\n")


def test_cancel_ends_the_stream_where_it_is(tok):
    async def main() -> tuple[bytes, bool]:
        run, outbox, session = _outbox(tok, None)
        run._deliver((0, _token(tok, "Hi")))
        session.cancel()
        run._deliver((0, _token(tok, " there")))  # in flight when the stop came: dropped
        return session.read(0), outbox.ended

    raw, ended = asyncio.run(main())
    assert ended and b'"Hi"' in raw and b"there" not in raw and b"[DONE]" not in raw


def test_drain_writes_the_final_error_into_the_session(tok):
    async def main() -> bytes:
        run, _, session = _outbox(tok, None)
        run._deliver((0, _token(tok, "Hi")))
        assert end_streams("the server is shutting down") >= 1
        return session.read(0)

    raw = asyncio.run(main())
    assert raw.endswith(b"data: [DONE]\n\n") and b'"code":503' in raw and b"shutting down" in raw


def test_a_reader_that_falls_behind_the_cap_is_cut():
    async def main() -> tuple[bytes | None, bool]:
        s = Session("c", cap=8)
        replay = Replay(Reader(s, 0, None, None))
        s.append(b"0123456789abcdef")  # the reader's offset 0 is gone before it read anything
        return await replay.take(None), replay.overflowed

    assert asyncio.run(main()) == (None, True)


def test_header_ids_match_their_url_encoded_form():
    wire = "café::org/m".encode().decode("latin-1")  # how the header's UTF-8 bytes reach a handler
    assert header_id(wire) == "café::org/m" and header_id("conv-1") == "conv-1"
    assert header_id("\xff\xfe") == "\xff\xfe"  # not UTF-8: as given
