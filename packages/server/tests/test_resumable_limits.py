"""Resumable streams on a real server whose stream settings are shortened (a 4 KiB ring, a 1 s TTL swept every
0.25 s), started through the real command line with an API key and `--api-prefix`: the key on every stream
route, the dropped prefix, expiry, and SIGTERM ending every reader."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from conftest import Server, assert_error, free_port, smollm2_path, sse_events

KEY = "secret-key"
OTHER = "another-key"  # a second client of the same server
PREFIX = "/llm"
CAP = 4096
SETTINGS = {"stream_session_bytes": CAP, "stream_session_ttl": 1.0, "stream_gc_interval": 0.25}
AUTH = {"Authorization": f"Bearer {KEY}"}

# the real `llama-server` command line, with the stream settings (which have no flags) replaced
_LAUNCH = """
import dataclasses, json, sys
from llama_server import cli
settings = json.loads(sys.argv[1])
build = cli.build_config
cli.build_config = lambda kw: dataclasses.replace(build(kw), **settings)
cli.main(sys.argv[2:])
"""


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("limited") / "server.log"
    args = ["-m", str(smollm2_path()), "--port", str(port), "-c", "2048", "-np", "2", "--temp", "0"]
    args += ["--api-key", f"{KEY},{OTHER}", "--api-prefix", PREFIX]
    cmd = [sys.executable, "-c", _LAUNCH, json.dumps(SETTINGS), *args]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ})
    base = f"http://127.0.0.1:{port}{PREFIX}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(base + "/health", headers=AUTH, timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    server = Server(base, proc, log)
    yield server
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def client(limited: Server) -> Iterator[httpx.Client]:
    with limited.client(headers=AUTH) as c:
        yield c


def _chat(max_tokens: int) -> dict:
    return {
        "messages": [{"role": "user", "content": "Tell a story."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


def _id() -> str:
    return f"conv-{uuid.uuid4().hex}"


def test_api_key_applies_to_every_stream_route(limited, client):
    conv_id = _id()
    with httpx.Client(base_url=limited.base_url, timeout=60) as anon:
        calls = [
            ("GET", "/v1/stream", {"params": {"conv_id": conv_id}}),
            ("DELETE", "/v1/stream", {"params": {"conv_id": conv_id}}),
            ("POST", "/v1/streams/lookup", {"json": {"conversation_ids": [conv_id]}}),
            ("POST", "/v1/chat/completions", {"json": _chat(2), "headers": {"X-Conversation-Id": conv_id}}),
        ]
        for method, path, kw in calls:
            assert_error(anon.request(method, path, **kw), 401, "authentication_error")
            bad = {**kw, "headers": {**kw.get("headers", {}), "Authorization": "Bearer wrong"}}
            assert_error(anon.request(method, path, **bad), 401, "authentication_error")
    assert client.post("/v1/streams/lookup", json={"conversation_ids": [conv_id]}).json() == []  # no session
    r = client.post("/v1/chat/completions", json=_chat(2), headers={"X-Conversation-Id": conv_id})
    assert r.status_code == 200
    replay = client.get("/v1/stream", params={"conv_id": conv_id})
    assert replay.status_code == 200 and replay.content == r.content
    r = client.get("/v1/stream", params={"conv_id": conv_id, "from": 0}, headers={"X-Api-Key": KEY})
    assert r.status_code == 200
    assert client.delete("/v1/stream", params={"conv_id": conv_id}).status_code == 204
    assert httpx.get(limited.base_url.removesuffix(PREFIX) + "/v1/stream", headers=AUTH).status_code == 404


def test_sessions_are_scoped_to_the_key_that_created_them(limited, client):
    """With several keys a session exists only for its own key: another key's lookup, replay and stop do
    not see it, and its POST with the same id starts a session of its own instead of replacing it."""
    conv_id = _id()
    with httpx.Client(base_url=limited.base_url, timeout=60, headers={"X-Api-Key": OTHER}) as other:
        with client.stream("POST", "/v1/chat/completions", json=_chat(120),
                           headers={"X-Conversation-Id": conv_id}) as mine:  # fmt: skip
            assert mine.status_code == 200
            chunks = mine.iter_raw()
            first = next(chunks)
            assert other.post("/v1/streams/lookup", json={"conversation_ids": [conv_id]}).json() == []
            assert_error(other.get("/v1/stream", params={"conv_id": conv_id}), 404, "not_found_error")
            assert other.delete("/v1/stream", params={"conv_id": conv_id}).status_code == 204  # a no-op
            r = other.post("/v1/chat/completions", json=_chat(2), headers={"X-Conversation-Id": conv_id})
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
            [theirs] = other.post("/v1/streams/lookup", json={"conversation_ids": [conv_id]}).json()
            assert theirs["is_done"] and theirs["total_bytes"] == len(r.content)
            assert other.get("/v1/stream", params={"conv_id": conv_id}).content == r.content
            [entry] = client.post("/v1/streams/lookup", json={"conversation_ids": [conv_id]}).json()
            assert not entry["is_done"]  # still generating: neither the stop nor the POST touched it
            body = first + b"".join(chunks)
        assert body.endswith(b"data: [DONE]\n\n") and body.count(b'"finish_reason":"length"') == 1
        [entry] = client.post("/v1/streams/lookup", json={"conversation_ids": [conv_id]}).json()
        assert entry["is_done"] and entry["total_bytes"] == len(body)  # (over the 4 KiB ring: no replay)
        assert client.delete("/v1/stream", params={"conv_id": conv_id}).status_code == 204
        assert_error(client.get("/v1/stream", params={"conv_id": conv_id}), 404, "not_found_error")


def test_offsets_below_the_dropped_prefix_are_lost(limited, client):
    conv_id = _id()
    r = client.post("/v1/chat/completions", json=_chat(30), headers={"X-Conversation-Id": conv_id})
    full = r.content
    assert len(full) > 2 * CAP, len(full)
    [entry] = client.post("/v1/streams/lookup", json={"conversation_ids": [conv_id]}).json()
    assert entry["total_bytes"] == len(full) and entry["is_done"]
    dropped = len(full) - CAP
    for off in (0, 1, dropped - 1):
        err = assert_error(client.get("/v1/stream", params={"conv_id": conv_id, "from": off}), 400)
        assert (
            err["message"] == "Stream offset lost, please restart" and err["type"] == "invalid_request_error"
        )
    for off in (dropped, dropped + 17, len(full)):
        tail = client.get("/v1/stream", params={"conv_id": conv_id, "from": off})
        assert tail.status_code == 200 and tail.content == full[off:], off
    assert sse_events(full.decode())[-1] == "[DONE]"


def test_finished_sessions_expire_after_the_ttl(limited, client):
    conv_id = _id()
    client.post("/v1/chat/completions", json=_chat(2), headers={"X-Conversation-Id": conv_id})
    assert client.get("/v1/stream", params={"conv_id": conv_id}).status_code == 200
    t0 = time.monotonic()
    while client.get("/v1/stream", params={"conv_id": conv_id}).status_code == 200:
        assert time.monotonic() - t0 < 5, "the finished session was never collected"
        time.sleep(0.1)
    # completed_at has a one-second resolution: gone after 1-2 s of TTL plus at most one 0.25 s sweep
    assert time.monotonic() - t0 < 2.6
    assert_error(client.get("/v1/stream", params={"conv_id": conv_id}), 404, "not_found_error")
    assert client.post("/v1/streams/lookup", json={"conversation_ids": [conv_id]}).json() == []


def test_running_sessions_are_never_collected(limited, client):
    conv_id = _id()
    with httpx.stream(
        "POST",
        limited.base_url + "/v1/chat/completions",
        json=_chat(1000),  # still generating a second later, even on a fast machine
        headers={**AUTH, "X-Conversation-Id": conv_id},
        timeout=120,
    ) as r:
        next(r.iter_raw())
    time.sleep(1.0)  # past the TTL, while it is still generating for nobody
    [entry] = client.post("/v1/streams/lookup", json={"conversation_ids": [conv_id]}).json()
    assert entry["is_done"] is False and entry["completed_at"] == 0
    client.delete("/v1/stream", params={"conv_id": conv_id})


def test_sigterm_finalises_every_session_so_no_reader_hangs(limited, client):
    """Last in this module: it stops the server. A follower of a detached generation (its POST client
    gone) gets the final 503 event and [DONE] and its response ends; the process exits 0."""
    conv_id = _id()
    with httpx.stream(
        "POST",
        limited.base_url + "/v1/chat/completions",
        json=_chat(1000),
        headers={**AUTH, "X-Conversation-Id": conv_id},
        timeout=120,
    ) as r:
        next(r.iter_raw())
    got: list[bytes] = []
    reading = threading.Event()

    def follow() -> None:
        with httpx.stream(
            "GET", limited.base_url + "/v1/stream", params={"conv_id": conv_id}, headers=AUTH, timeout=60
        ) as resp:
            for chunk in resp.iter_raw():
                got.append(chunk)
                reading.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    assert reading.wait(30)
    t0 = time.monotonic()
    limited.proc.send_signal(signal.SIGTERM)
    reader.join(30)
    assert not reader.is_alive(), "the reader still waits"
    rc = limited.proc.wait(timeout=60)
    seconds = time.monotonic() - t0
    print(f"SIGTERM: reader ended, exit after {seconds:.2f} s")
    events = sse_events(b"".join(got).decode())
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["error"]["code"] == 503 and "shutting down" in last["error"]["message"]
    log = limited.log.read_text()
    assert rc == 0, log[-3000:]
    assert "Traceback" not in log and conv_id not in log and conv_id[5:] not in log
