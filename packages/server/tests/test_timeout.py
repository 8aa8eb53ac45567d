"""`--timeout`: read and write limits on one HTTP exchange (the IOTimeouts wrapper, and a real server)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from click.testing import CliRunner
from conftest import start_server, stop_server

from llama_server import cli
from llama_server.cli import main
from llama_server.headers import CanonicalHeaders
from llama_server.middleware import IOTimeouts


async def _echo_app(scope, receive, send) -> None:
    """Reads the whole body, then answers it in two chunks."""
    body = b""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise OSError("client went away")
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await send({"type": "http.response.body", "body": b"!", "more_body": False})


def _exchange(app, incoming: list[dict | None], send_delay: float = 0.0) -> list[dict]:
    """Run one request through `app`; None in `incoming` is a client that stops sending."""
    sent: list[dict] = []

    async def receive() -> dict:
        if not incoming:
            await asyncio.sleep(3600)
        msg = incoming.pop(0)
        if msg is None:
            await asyncio.sleep(3600)
        return msg  # type: ignore[return-value]

    async def send(msg: dict) -> None:
        if msg["type"] == "http.response.body" and send_delay:
            await asyncio.sleep(send_delay)
        sent.append(msg)

    asyncio.run(app({"type": "http", "method": "POST", "path": "/x"}, receive, send))
    return sent


def test_passes_a_normal_exchange_through():
    msgs = [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"c"},
    ]
    sent = _exchange(IOTimeouts(_echo_app, 1.0), msgs)
    assert [m.get("status") for m in sent] == [200, None, None]
    assert b"".join(m.get("body", b"") for m in sent) == b"abc!"


def test_stalled_body_is_answered_408():
    t0 = time.monotonic()
    sent = _exchange(
        IOTimeouts(_echo_app, 0.2), [{"type": "http.request", "body": b"ab", "more_body": True}, None]
    )
    assert time.monotonic() - t0 < 5
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert b"Request timeout" in sent[1]["body"] and len(sent) == 2


def test_unread_response_drops_the_connection():
    t0 = time.monotonic()
    sent = _exchange(IOTimeouts(_echo_app, 0.2), [{"type": "http.request", "body": b"ab"}], send_delay=30)
    assert time.monotonic() - t0 < 5
    assert [m.get("status") for m in sent] == [200]  # the body never went out; no second response either


def test_zero_means_no_limit():
    app = IOTimeouts(_echo_app, 0)
    assert _exchange(app, [{"type": "http.request", "body": b"x"}])[-1]["body"] == b"!"


@pytest.fixture
def captured(monkeypatch):
    seen: dict = {}
    monkeypatch.setattr(cli, "serve", lambda app, state, **kw: seen.update(app=app, **kw))
    return seen


TIMEOUT_FLAGS = [
    ([], {}, 3600),
    (["-to", "7"], {}, 7),
    (["--timeout", "8"], {}, 8),
    ([], {"LLAMA_ARG_TIMEOUT": "9"}, 9),
    (["-to", "5"], {"LLAMA_ARG_TIMEOUT": "9"}, 5),
]


@pytest.mark.parametrize(("args", "env", "expected"), TIMEOUT_FLAGS)
def test_option_parses_and_create_app_wraps_it(captured, args, env, expected):
    r = CliRunner().invoke(main, args, env=env)
    assert r.exit_code == 0, r.output
    app = captured["app"]  # the Litestar app create_app built: canonical header names, then the timeouts
    handler = app.asgi_handler
    assert isinstance(handler, CanonicalHeaders) and isinstance(handler.app, IOTimeouts)
    assert handler.app.seconds == expected
    assert app.state.server.config.timeout == expected


def test_real_server_times_out_a_stalled_body(tmp_path):
    server = start_server(tmp_path, "-c", "256", "-np", "1", "--no-warmup", "-to", "1")
    try:
        port = int(server.base_url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(
                b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"prompt": '
            )
            t0 = time.monotonic()
            reply = b""
            while chunk := sock.recv(65536):  # the server answers, then closes
                reply += chunk
            waited = time.monotonic() - t0
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"Request timeout" in reply and 0.5 < waited < 20
        with server.client() as c:  # the server itself is fine
            assert c.get("/health").status_code == 200
    finally:
        stop_server(server)
