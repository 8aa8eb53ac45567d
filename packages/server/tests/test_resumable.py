"""Resumable streams on the shared real server (SmolLM2, greedy): `X-Conversation-Id` on every streaming API,
disconnect and resume byte for byte, replacement, DELETE, lookup, the 400/404 cases, and the path without
the header left as it was."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import uuid
from urllib.parse import quote

import httpx
import pytest
from conftest import assert_error, sse_events

CHAT = "/v1/chat/completions"


def _chat(max_tokens: int, content: str = "Tell a story about a cat.", **kw) -> dict:
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        **kw,
    }


def _new_id() -> str:
    return f"conv-{uuid.uuid4().hex}"


def _replay(client: httpx.Client, conv_id: str, offset: int | str = 0) -> httpx.Response:
    return client.get("/v1/stream", params={"conv_id": conv_id, "from": offset})


def _lookup(client: httpx.Client, *ids) -> list[dict]:
    r = client.post("/v1/streams/lookup", json={"conversation_ids": list(ids)})
    assert r.status_code == 200, r.text
    return r.json()


def _wait_done(client: httpx.Client, conv_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        [entry] = _lookup(client, conv_id)
        if entry["is_done"]:
            return entry
        time.sleep(0.1)
    raise AssertionError("the session did not finish")


def _busy(client: httpx.Client) -> int:
    return sum(s["is_processing"] for s in client.get("/slots").json())


def _wait_idle(client: httpx.Client, timeout: float = 30) -> float:
    t0 = time.monotonic()
    while _busy(client):
        assert time.monotonic() - t0 < timeout, "a slot is still generating"
        time.sleep(0.05)
    return time.monotonic() - t0


class _Follower(threading.Thread):
    """An uninterrupted reader: `GET /v1/stream?from=0` read to its end."""

    def __init__(self, base_url: str, conv_id: str, offset: int = 0) -> None:
        super().__init__(daemon=True)
        self.url, self.params = base_url + "/v1/stream", {"conv_id": conv_id, "from": offset}
        self.body = b""
        self.status = 0
        self.reading = threading.Event()  # set at its first bytes (or its end)

    def run(self) -> None:
        try:
            with httpx.stream("GET", self.url, params=self.params, timeout=120) as r:
                self.status = r.status_code
                for chunk in r.iter_raw():
                    self.body += chunk
                    self.reading.set()
        finally:
            self.reading.set()


def _post_and_drop(base_url: str, path: str, body: dict, conv_id: str, k: int) -> bytes:
    """POST a stream with the id, read `k` bytes of its body (at least the headers), then disconnect."""
    got = b""
    with httpx.stream(
        "POST", base_url + path, json=body, headers={"X-Conversation-Id": conv_id}, timeout=120
    ) as r:
        assert r.status_code == 200, r.read()[:300]
        assert r.headers["content-type"].startswith("text/event-stream")
        if k:
            for chunk in r.iter_raw():
                got += chunk
                if len(got) >= k:
                    break
    return got[:k]


_VOLATILE = re.compile(rb'"(created|id|created_at)":("[^"]*"|\d+),?|,?"timings":\{[^}]*\}')


def _normalised(raw: bytes) -> bytes:
    """A chat stream without what differs between two identical runs (id, creation time, timings)."""
    return _VOLATILE.sub(b"", raw)


def test_disconnect_and_resume_is_byte_identical(server, client):
    """The producer drops after 137 bytes (mid-event); a follower attached from 0 reads uninterrupted; a
    resume from 137 while the generation runs gives exactly the follower's bytes after 137; the finished
    session replays identically from every offset tried; and it equals a run without the header."""
    conv_id = _new_id()
    n_tokens = 24
    k = 137
    head = _post_and_drop(server.base_url, CHAT, _chat(n_tokens), conv_id, k)
    follower = _Follower(server.base_url, conv_id)
    follower.start()
    [entry] = _lookup(client, conv_id)
    assert entry["conversation_id"] == conv_id and entry["total_bytes"] >= k
    resumed = _replay(client, conv_id, k)  # follows the live generation to its end
    assert resumed.status_code == 200 and resumed.headers["content-type"].startswith("text/event-stream")
    follower.join(120)
    assert follower.status == 200
    full = follower.body
    assert head + resumed.content == full
    # the generation went on after the disconnect: every token is in the session, then [DONE]
    events = sse_events(full.decode())
    assert events[-1] == "[DONE]"
    usage = [json.loads(e) for e in events[:-1] if '"finish_reason":"length"' in e]
    assert usage, events[-3:]
    entry = _wait_done(client, conv_id)
    assert entry["total_bytes"] == len(full) and entry["completed_at"] >= entry["started_at"] > 0
    # every offset of the finished session: 0, 1, mid-event, an event boundary, the last byte, the end
    boundary = full.index(b"\n\n") + 2
    offsets = [0, 1, k, boundary, len(full) // 2 + 3, len(full) - 1, len(full)]
    for off in offsets:
        r = _replay(client, conv_id, off)
        assert r.status_code == 200, (off, r.text)
        assert full[:off] + r.content == full, off
    assert _replay(client, conv_id, len(full)).content == b""  # the end: an empty 200
    # an uninterrupted run without the header (greedy: the same tokens) has the same bytes but for ids,
    # timestamps and timings
    plain = client.post(CHAT, json=_chat(n_tokens)).content
    assert _normalised(plain) == _normalised(full)
    print(f"replay identical at offsets {offsets} of {len(full)} bytes")


@pytest.mark.parametrize(
    "path,body",
    [
        ("/completion", {"prompt": "Once upon a time", "n_predict": 6, "stream": True}),
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "stream": True}),
        ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "stream": True}),
        ("/v1/responses", {"input": "Hi", "max_output_tokens": 6, "stream": True}),
        ("/chat/completions", _chat(6)),
    ],
)
def test_every_streaming_api_is_replayable(server, client, path, body):
    """The POST client's own bytes (read to the end) are the session's bytes, for every API."""
    conv_id = _new_id()
    r = client.post(path, json=body, headers={"x-conversation-id": conv_id})  # read case-insensitively
    assert r.status_code == 200, r.text
    replay = _replay(client, conv_id)
    assert replay.status_code == 200
    assert replay.content == r.content and r.content
    client.delete("/v1/stream", params={"conv_id": conv_id})


def test_a_new_request_with_the_same_id_replaces_and_cancels_the_old(server, client):
    conv_id = _new_id()
    old_lines: list[bytes] = []
    with httpx.stream(
        "POST", server.base_url + CHAT, json=_chat(1500), headers={"X-Conversation-Id": conv_id}, timeout=120
    ) as old:
        assert old.status_code == 200
        it = old.iter_raw()
        old_lines.append(next(it))
        new = client.post(CHAT, json=_chat(3, "Say hi."), headers={"X-Conversation-Id": conv_id})
        assert new.status_code == 200
        for chunk in it:  # the old stream just ends: no [DONE], no error event
            old_lines.append(chunk)
    old_body = b"".join(old_lines)
    assert b"[DONE]" not in old_body and b'"error"' not in old_body
    assert _replay(client, conv_id).content == new.content  # the session is the new request's
    [entry] = _lookup(client, conv_id)
    assert entry["total_bytes"] == len(new.content)
    print(f"old generation stopped, slots idle after {_wait_idle(client):.2f} s")


def test_delete_stops_the_generation_and_is_idempotent(server, client):
    conv_id = _new_id()
    with httpx.stream(
        "POST", server.base_url + CHAT, json=_chat(1500), headers={"X-Conversation-Id": conv_id}, timeout=120
    ) as r:
        it = r.iter_raw()
        first = next(it)
        follower = _Follower(server.base_url, conv_id)
        follower.start()
        assert follower.reading.wait(30)
        d = client.delete("/v1/stream", params={"conv_id": conv_id})
        assert d.status_code == 204 and d.content == b""
        rest = b"".join(it)  # the live stream ends where it was
    follower.join(30)
    assert not follower.is_alive() and follower.status == 200
    assert b"[DONE]" not in first + rest
    assert follower.body == (first + rest)[: len(follower.body)]
    assert_error(_replay(client, conv_id), 404, "not_found_error")
    assert _lookup(client, conv_id) == []
    for _ in range(2):  # unknown ids too: always 204
        assert client.delete("/v1/stream", params={"conv_id": conv_id}).status_code == 204
    assert client.delete("/v1/stream", params={"conv_id": _new_id()}).status_code == 204
    print(f"slots idle {_wait_idle(client):.2f} s after DELETE")


def test_lookup_answers_only_for_the_ids_named(server, client):
    base = _new_id()
    ids = [base, base + "::org/model-a", base + "::b"]
    for conv_id in ids:
        assert client.post(CHAT, json=_chat(2), headers={"X-Conversation-Id": conv_id}).status_code == 200
    other = _new_id()
    assert client.post(CHAT, json=_chat(2), headers={"X-Conversation-Id": other}).status_code == 200
    found = _lookup(client, base)  # the id and its `<id>::<model>` variants, nothing else
    assert sorted(e["conversation_id"] for e in found) == sorted(ids)
    for e in found:
        assert list(e) == ["conversation_id", "is_done", "total_bytes", "started_at", "completed_at"]
        assert e["is_done"] is True and e["total_bytes"] > 0
        assert isinstance(e["started_at"], int) and e["completed_at"] >= e["started_at"]
    assert [e["conversation_id"] for e in _lookup(client, ids[1], ids[1])] == [ids[1], ids[1]]
    assert _lookup(client, base + "::") == []  # a prefix is not an id
    assert _lookup(client, base[:-1]) == []
    assert _lookup(client) == []  # nothing named, nothing listed
    assert _lookup(client, 5, None, "", [other]) == []
    for body in ({}, {"conversation_ids": other}, [other], "x"):
        r = client.post("/v1/streams/lookup", json=body)
        assert r.status_code == 200 and r.json() == [], body
    r = client.post("/v1/streams/lookup", content=b"{not json")
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error" and "code" not in r.json()["error"]
    assert r.json()["error"]["message"].startswith("invalid body: ")
    for conv_id in [*ids, other]:
        client.delete("/v1/stream", params={"conv_id": conv_id})


def test_stream_route_errors(server, client):
    conv_id = _new_id()
    client.post(CHAT, json=_chat(2), headers={"X-Conversation-Id": conv_id})
    for params in ({}, {"conv_id": ""}, {"from": "0"}):
        err = assert_error(client.get("/v1/stream", params=params), 400, "invalid_request_error")
        assert err["message"] == "Missing conversation id in path"
    err = assert_error(client.delete("/v1/stream"), 400, "invalid_request_error")
    assert err["message"] == "Missing conversation id in path"
    err = assert_error(_replay(client, _new_id()), 404, "not_found_error")
    assert err["message"] == "Stream not found or expired"
    for bad in ("-1", "abc", "1.5", "+3", " 2", "0x10", "١"):
        err = assert_error(_replay(client, conv_id, bad), 400, "invalid_request_error")
        assert err["message"] == "Invalid 'from' offset", bad
    huge = _replay(client, conv_id, 10**30)  # past the end of a finished stream: nothing more comes
    assert huge.status_code == 200 and huge.content == b""
    assert client.get("/health").status_code == 200
    client.delete("/v1/stream", params={"conv_id": conv_id})


def test_requests_that_do_not_stream_leave_no_session(server, client):
    conv_id = _new_id()
    body = {**_chat(2), "stream": False}
    r = client.post(CHAT, json=body, headers={"X-Conversation-Id": conv_id})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    assert _lookup(client, conv_id) == []
    too_long = {"prompt": "hello " * 3000, "n_predict": 2, "stream": True}
    r = client.post("/completion", json=too_long, headers={"X-Conversation-Id": conv_id})
    assert_error(r, 400, "exceed_context_size_error")  # the first result decides: a JSON error
    assert _lookup(client, conv_id) == []
    r = client.post(CHAT, json={"messages": "nope", "stream": True}, headers={"X-Conversation-Id": conv_id})
    assert r.status_code == 400 and _lookup(client, conv_id) == []


def test_a_replacement_by_a_request_that_does_not_stream_still_cancels(server, client):
    """Creation replaces: even a request that then leaves nothing (non-streamed) stops the old one."""
    conv_id = _new_id()
    with httpx.stream(
        "POST", server.base_url + CHAT, json=_chat(1500), headers={"X-Conversation-Id": conv_id}, timeout=120
    ) as r:
        it = r.iter_raw()
        next(it)
        plain = client.post(CHAT, json={**_chat(2), "stream": False}, headers={"X-Conversation-Id": conv_id})
        assert plain.status_code == 200
        rest = b"".join(it)
    assert b"[DONE]" not in rest
    assert _lookup(client, conv_id) == []
    _wait_idle(client)


def test_without_the_header_a_disconnect_still_cancels(server, client):
    """The OpenAI path without `X-Conversation-Id` is unchanged: dropping the connection frees the slot,
    and nothing is kept for replay."""
    with httpx.stream("POST", server.base_url + CHAT, json=_chat(1500), timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        it = r.iter_raw()
        head = next(it)
        deadline = time.monotonic() + 30
        busy = _busy(client)
        while not busy and time.monotonic() < deadline:  # /slots may lag the first event a step
            time.sleep(0.02)
            busy = _busy(client)
        if not busy:  # the generation is not running: what did its stream say?
            pytest.fail(f"no slot is generating; the stream held: {(head + b''.join(it))[-800:]!r}")
    seconds = _wait_idle(client)
    print(f"slot freed {seconds:.2f} s after the disconnect")
    r = client.post(CHAT, json=_chat(3))
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and len(events) == 6  # role, 3 tokens, finish, [DONE]


def test_slashed_model_id_in_the_query_string(server, client):
    """llama.cpp's own case (test_stream.py, here without the router): an id holding `::` and `/`, sent
    percent-encoded in the query string, replays and stops."""
    stream_id = f"conv-stream-test-{uuid.uuid4().hex}::ggml-org/tinygemma3-GGUF:Q8_0"
    qs = "conv_id=" + quote(stream_id, safe="")
    body = {**_chat(8, "hello"), "model": "ggml-org/tinygemma3-GGUF:Q8_0"}
    r = client.post("/chat/completions", json=body, headers={"X-Conversation-Id": stream_id})
    content = "".join(
        (json.loads(e)["choices"][0]["delta"].get("content") or "")
        for e in sse_events(r.text)
        if e != "[DONE]" and json.loads(e)["choices"]
    )
    assert content
    res = client.get(f"/v1/stream?{qs}&from=0")
    assert res.status_code == 200 and "data: " in res.text and res.content == r.content
    assert client.delete(f"/v1/stream?{qs}").status_code == 204
    assert client.get(f"/v1/stream?{qs}&from=0").status_code == 404


def test_a_drop_before_the_first_token_does_not_lose_the_generation(server, client):
    """A page reload while the prompt is still being processed: the connection closes before any byte
    of the response, and the whole generation is still there to replay."""
    conv_id = _new_id()
    payload = json.dumps(_chat(6, "Summarise this. " + "The cat sat on the mat. " * 150)).encode()
    host, port = server.base_url.removeprefix("http://").split(":")
    head = f"POST {CHAT} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    head += f"X-Conversation-Id: {conv_id}\r\nContent-Length: {len(payload)}\r\n\r\n"
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head.encode() + payload)
        deadline = time.monotonic() + 30
        while not _lookup(client, conv_id):  # the session exists once the prompt is rendered
            assert time.monotonic() < deadline
            time.sleep(0.01)
        [entry] = _lookup(client, conv_id)
    # closed: if this was before the first token, nothing had been sent yet
    print(f"dropped at {entry['total_bytes']} bytes of the response")
    _wait_done(client, conv_id)
    events = sse_events(_replay(client, conv_id).text)
    assert events[-1] == "[DONE]" and len(events) == 9  # role, 6 tokens, finish, [DONE]
    client.delete("/v1/stream", params={"conv_id": conv_id})


def test_a_non_ascii_id_in_the_header_matches_its_query_string_form(server, client):
    conv_id = f"café-{uuid.uuid4().hex}::ørg/mödel"
    r = client.post(CHAT, json=_chat(2), headers={"X-Conversation-Id": conv_id.encode()})
    assert r.status_code == 200
    assert _replay(client, conv_id).content == r.content
    assert [e["conversation_id"] for e in _lookup(client, conv_id.split("::")[0])] == [conv_id]
    assert client.delete("/v1/stream", params={"conv_id": conv_id}).status_code == 204
