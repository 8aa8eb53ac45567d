"""The streaming driver: a client that stops reading is cut off (real socket, real server), and the wire
bytes each formatter writes for a stream (ends, errors mid-stream, SIGTERM's drain) from real engine events."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import smollm2_path, sse_events

import gguf_io
from llama_engine import FinalEvent, GenerationRequest, StopReason, Timings, TokenEvent, Usage
from llama_engine.tokenizer import Tokenizer
from llama_server import ServerConfig, ServerState
from llama_server.bridge import Run
from llama_server.formats import (
    AnthropicFormatter,
    ChatFormatter,
    CompletionsFormatter,
    NativeFormatter,
    Parsing,
    ResponsesFormatter,
)
from llama_server.streaming import STREAM_BUFFER_BYTES, Formatter, Outbox, end_streams

# -- a client that stops reading ---------------------------------------------------------------------------


# ~70 KB of JSON per token: unbounded, this stream would queue over 100 MB for a client that reads nothing
LONG_PROBS_STREAM = {
    "prompt": "Once upon a time",
    "n_predict": 1800,
    "n_probs": 1024,
    "stream": True,
    "ignore_eos": True,
}


def _busy(client: httpx.Client) -> int:
    return sum(s["is_processing"] for s in client.get("/slots").json())


def _stalled_stream(base_url: str, body: dict) -> socket.socket:
    """POST `body` on a raw socket with a small receive buffer, read until the first event, then stop."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)  # before connect: a small TCP window
    sock.connect((host, int(port)))
    payload = json.dumps(body).encode()
    head = f"POST /completion HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    sock.sendall(head.encode() + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    got = b""
    while b"data: " not in got:
        chunk = sock.recv(4096)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    return sock


def _read_to_end(sock: socket.socket) -> bytes:
    sock.settimeout(60)
    out = b""
    while chunk := sock.recv(1 << 16):
        out += chunk
    return out


def _tcp_send_buffer_max() -> int:
    return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])


def test_stalled_reader_is_cut_and_its_slot_freed(server, client):
    sock = _stalled_stream(server.base_url, LONG_PROBS_STREAM)
    try:
        # another stream runs to its end meanwhile
        other = client.post("/completion", json={"prompt": "Hello", "n_predict": 16, "stream": True})
        events = [json.loads(e) for e in sse_events(other.text)]
        assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 16
        # the stalled stream's generation is cancelled once its buffer is full: every slot becomes idle while
        # the client still holds the connection without reading
        deadline = time.monotonic() + 300
        while _busy(client) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _busy(client) == 0
        log = server.log.read_text()
        queued = [int(n) for n in re.findall(r"not reading its stream: (\d+) bytes queued", log)]
        assert queued and max(queued) <= STREAM_BUFFER_BYTES + (1 << 20)  # the limit plus one step's events
        rest = _read_to_end(sock)
    finally:
        sock.close()
    # what the client gets afterwards is what was in flight: the kernel's buffers, the transport's and at most
    # one outbox; the stream is cut (no final event, no last chunk of the chunked body)
    assert len(rest) < 2 * STREAM_BUFFER_BYTES + _tcp_send_buffer_max() + (1 << 20)
    assert b'"stop":true' not in rest and not rest.endswith(b"0\r\n\r\n")
    assert _busy(client) == 0


def test_stalled_reader_does_not_stall_others(server, client):
    """Two stalled readers and two normal streams at once: the normal ones finish."""
    socks = [_stalled_stream(server.base_url, LONG_PROBS_STREAM) for _ in range(2)]
    results: list[list[dict] | Exception] = [[], []]

    def one(i: int) -> None:
        try:
            body = {"prompt": f"Number {i}:", "n_predict": 32, "stream": True, "ignore_eos": True}
            r = httpx.post(server.base_url + "/completion", json=body, timeout=300)
            results[i] = [json.loads(e) for e in sse_events(r.text)]
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    finally:
        for s in socks:
            s.close()
    for res in results:
        assert isinstance(res, list), res
        assert res[-1]["stop"] is True and res[-1]["tokens_predicted"] == 32


# -- the bytes each formatter writes -----------------------------------------------------------------------

TIMINGS = Timings(3, 1.0, 2, 2.0, 0)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    with gguf_io.open(smollm2_path()) as f:
        return Tokenizer.from_gguf(f.tokenizer)


def _final(reason: StopReason = StopReason.LENGTH, error: str = "", n: int = 2) -> FinalEvent:
    return FinalEvent(reason, Usage(3, n), TIMINGS, error=error, slot=0)


def _stream(
    fmt: Formatter, events: list, n: int = 1, drain: str | None = None, limit: int = STREAM_BUFFER_BYTES
):
    """The bytes an Outbox queues for `events` ((choice, event) pairs) given to a real Run."""

    async def main() -> tuple[bytes, Outbox]:
        run = Run(ServerState(ServerConfig(model="m.gguf")))
        run.n, run.task_ids = n, list(range(n))
        outbox = Outbox(run, fmt, limit)
        run.attach(outbox.add)
        for item in events:
            run._deliver(item)
        if drain is not None:
            assert end_streams(drain) >= 1
        out = b""
        while (chunk := await outbox.take(None)) is not None:
            out += chunk
        return out, outbox

    return asyncio.run(main())


def _chat(tok: Tokenizer, tools: bool = False, usage: bool = False) -> ChatFormatter:
    parsing = Parsing(True, tools)
    return ChatFormatter(
        tok, parsing, 1, id="chatcmpl-x", created=1, model="m", n_probs=0, post=False, include_usage=usage
    )


def _anthropic(tok: Tokenizer, tools: bool = False) -> AnthropicFormatter:
    return AnthropicFormatter(tok, Parsing(True, tools), id="a", model="m", n_prompt=3)


def _formatters(tok: Tokenizer) -> dict[str, Formatter]:
    return {
        "completions": CompletionsFormatter(tok, id="c", created=1, model="m", n_probs=0, post=False),
        "chat": _chat(tok),
        "anthropic": _anthropic(tok),
        "responses": ResponsesFormatter(tok, Parsing(True, False), created=1, model="m"),
    }


def _events(raw: bytes) -> list[tuple[str | None, dict | str]]:
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        name = None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
                out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


def test_framing_of_a_whole_stream(tok):
    toks = [(0, TokenEvent(1, "Hi")), (0, TokenEvent(2, " there")), (0, _final())]
    for name, fmt in _formatters(tok).items():
        raw, _ = _stream(fmt, toks)
        events = _events(raw)
        assert raw.endswith(b"\n\n") and b"\r" not in raw
        if name in ("completions", "chat"):
            assert events[-1] == (None, "[DONE]") and all(n is None for n, _ in events)
        else:  # named events: the name is the data's type; no [DONE]
            assert all(n == d["type"] for n, d in events) and b"[DONE]" not in raw
    chat = _events(_stream(_chat(tok, usage=True), toks)[0])
    assert chat[0][1]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert [e[1]["choices"][0]["delta"].get("content") for e in chat[1:3]] == ["Hi", " there"]
    assert chat[3][1]["choices"][0] == {"finish_reason": "length", "index": 0, "delta": {}}
    assert chat[4][1]["choices"] == [] and chat[4][1]["usage"]["completion_tokens"] == 2


def test_error_mid_stream_is_the_last_event(tok):
    toks = [(0, TokenEvent(1, "Hi")), (0, _final(StopReason.ERROR, "Context size has been exceeded."))]
    for name, fmt in _formatters(tok).items():
        raw, outbox = _stream(fmt, toks)
        last = _events(raw)[-1]
        err = {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}
        if name == "anthropic":
            assert last == ("error", err)  # the error object itself
        else:
            assert last == (None, {"error": err})  # OAI form, Responses included
        assert b"[DONE]" not in raw and outbox.ended


def test_end_streams_sends_a_final_error_then_done(tok):
    raw, _ = _stream(_chat(tok), [(0, TokenEvent(1, "Hi"))], drain="the server is shutting down")
    events = _events(raw)
    err = {"code": 503, "message": "the server is shutting down", "type": "unavailable_error"}
    assert events[-2:] == [(None, {"error": err}), (None, "[DONE]")]
    raw, _ = _stream(_anthropic(tok), [(0, TokenEvent(1, "Hi"))], drain="bye")
    assert _events(raw)[-1] == ("error", {**err, "message": "bye"})


def test_a_full_outbox_drops_its_bytes_and_ends(tok):
    toks = [(0, TokenEvent(1, "x" * 100)) for _ in range(50)]
    raw, outbox = _stream(_chat(tok), toks, limit=2000)
    assert outbox.overflowed and outbox.ended and raw == b""


def test_tool_calls_stream_as_deltas(tok):
    text = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    toks = [(0, TokenEvent(i, text[i : i + 7])) for i in range(0, len(text), 7)]
    events = _events(_stream(_chat(tok, tools=True), [*toks, (0, _final(StopReason.EOS))])[0])
    deltas = [d["choices"][0]["delta"] for _, d in events[:-1]]
    calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert len(calls) == 1 and calls[0][0]["index"] == 0 and calls[0][0]["type"] == "function"
    assert calls[0][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert events[-2][1]["choices"][0]["finish_reason"] == "tool_calls"
    names = [
        n for n, _ in _events(_stream(_anthropic(tok, tools=True), [*toks, (0, _final(StopReason.EOS))])[0])
    ]
    block = ["content_block_start", "content_block_delta", "content_block_stop"]
    assert names == ["message_start", *block, "message_delta", "message_stop"]


def test_reasoning_and_text_blocks(tok):
    toks = [(0, TokenEvent(1, "<think>hmm</think>")), (0, TokenEvent(2, "ok")), (0, _final())]
    anthropic = _events(_stream(_anthropic(tok), toks)[0])
    starts = [d["content_block"]["type"] for n, d in anthropic if n == "content_block_start"]
    assert starts == ["thinking", "text"]
    sig = [d for n, d in anthropic if n == "content_block_delta" and d["delta"]["type"] == "signature_delta"]
    assert sig == [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": ""}}
    ]
    responses = _events(_stream(_formatters(tok)["responses"], toks)[0])
    done = responses[-1][1]["response"]
    assert [o["type"] for o in done["output"]] == ["reasoning", "message"]
    assert done["output"][1]["content"][0]["text"] == "ok"


def test_native_stream_ends_without_done(tok):
    req = GenerationRequest(prompt=tok.encode("Hi"), max_tokens=2)
    fmt = NativeFormatter(tok, [req], [{}], "m", n_probs=0, post=False)
    events = _events(_stream(fmt, [(0, TokenEvent(1, "a\n")), (0, TokenEvent(2, "b")), (0, _final())])[0])
    assert [d["stop"] for _, d in events] == [False, False, True]
    assert events[-1][1]["content"] == "" and events[-1][1]["has_new_line"] is True
    first = {"index": 0, "content": "a\n", "tokens": [1], "stop": False, "id_slot": -1, "tokens_predicted": 1}
    assert events[0][1] == {**first, "tokens_evaluated": len(req.prompt)}
