"""Fault cases on a real `llama-server` process (SmolLM2 on loopback): the event loop keeps answering while
a large request is tokenized, and SIGTERM ends every open stream with a final event, then exits 0."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import httpx
from conftest import start_server


def _post_raw(base_url: str, path: str, body: bytes) -> socket.socket:
    """Send a whole POST on a fresh connection and return the socket (the reply is read later)."""
    host, port = base_url.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=300)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    sock.sendall(head.encode() + body)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(1 << 16):
        out += chunk
    sock.close()
    return out


def test_health_answers_while_a_large_request_is_tokenized(server):
    """A legal /tokenize of 400,000 characters (runs of one letter, the tokenizer's slow case) takes the
    tokenizer seconds; /health requests sent meanwhile finish first (order of completion)."""
    done: list[str] = []
    body = json.dumps({"content": ["x" * 100_000, "y" * 100_000, "z" * 100_000, "w" * 100_000]}).encode()
    sock = _post_raw(server.base_url, "/tokenize", body)

    def read_big() -> None:
        reply = _read_all(sock)
        done.append("tokenize " + reply.split(b"\r\n", 1)[0].decode())

    reader = threading.Thread(target=read_big)
    reader.start()
    time.sleep(0.3)  # the body is on the wire; the server is tokenizing it
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        for _ in range(3):
            r = c.get("/health")
            done.append(f"health {r.status_code}")
    reader.join(timeout=300)
    assert done == ["health 200"] * 3 + ["tokenize HTTP/1.1 200 OK"]


STREAMS = {
    "native": ("/completion", {"prompt": "Once upon a time", "n_predict": 4000, "ignore_eos": True}),
    "completions": (
        "/v1/completions",
        {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True},
    ),
    "chat": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 4000,
            "ignore_eos": True,
        },
    ),
    "anthropic": (
        "/v1/messages",
        {"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 4000},
    ),
}


class _Reader(threading.Thread):
    """Reads one SSE stream to its end; `started` is set at its first token."""

    def __init__(self, base_url: str, path: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.url, self.body = base_url + path, {**body, "stream": True}
        self.lines: list[str] = []
        self.started = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=120) as r:
                assert r.status_code == 200, r.read()[:300]
                for line in r.iter_lines():
                    if line:
                        self.lines.append(line)
                    if sum(1 for x in self.lines if x.startswith("data: ")) >= 3:
                        self.started.set()
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.started.set()

    def data(self) -> list[str]:
        return [x[6:] for x in self.lines if x.startswith("data: ")]


def test_sigterm_ends_streams_with_a_final_event_and_exits_0(tmp_path):
    server = start_server(tmp_path, "-c", "8192", "-np", "4", "--temp", "0")
    readers = {name: _Reader(server.base_url, path, body) for name, (path, body) in STREAMS.items()}
    try:
        for r in readers.values():
            r.start()
        for name, r in readers.items():
            assert r.started.wait(120) and r.error is None, (name, r.error)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        rc = server.proc.wait(timeout=60)
        seconds = time.monotonic() - t0
        for r in readers.values():
            r.join(timeout=60)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
    log = server.log.read_text()
    print(f"SIGTERM to exit: {seconds:.2f} s")
    assert rc == 0, log[-3000:]
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]
    for name in ("native", "completions", "chat"):
        data = readers[name].data()
        assert readers[name].error is None, (name, readers[name].error)
        if name != "native":
            assert data[-1] == "[DONE]", (name, data[-3:])
            data = data[:-1]
        last = json.loads(data[-1])
        assert last["error"]["code"] == 503 and last["error"]["type"] == "unavailable_error", (name, last)
        assert "shutting down" in last["error"]["message"]
    lines = readers["anthropic"].lines  # the reference writes the error object itself as the event's data
    assert lines[-2] == "event: error", lines[-4:]
    err = json.loads(lines[-1][6:])
    assert err["code"] == 503 and err["message"].endswith("shutting down"), err
