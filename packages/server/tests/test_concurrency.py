"""Disconnect mid-stream frees the slot; 8 concurrent streams all finish."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import httpx
from conftest import sse_events


def _busy(client: httpx.Client) -> int:
    return sum(s["is_processing"] for s in client.get("/slots").json())


def _wait_idle(client: httpx.Client, seconds: float = 8) -> int:
    """Busy slots once they are all idle or `seconds` passed (the engine marks a slot idle just after it
    emits the final event, so a fast client can see it busy for a moment)."""
    deadline = time.monotonic() + seconds
    while _busy(client) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _busy(client)


def test_disconnect_frees_slot(server, client):
    with httpx.Client(base_url=server.base_url, timeout=120) as c2:
        with c2.stream(
            "POST",
            "/completion",
            json={"prompt": "Once upon a time", "n_predict": 2000, "stream": True, "ignore_eos": True},
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break  # got a token: now hang up
        assert _busy(client) >= 0
    assert _wait_idle(client) == 0


def test_disconnect_non_stream(server, client):
    with httpx.Client(base_url=server.base_url, timeout=1.5) as c2, contextlib.suppress(httpx.ReadTimeout):
        c2.post("/completion", json={"prompt": "Once upon a time", "n_predict": 2000, "ignore_eos": True})
    # the whole generation would take far longer than this: the slot was freed by the disconnect
    assert _wait_idle(client) == 0


def test_eight_concurrent_streams(server, client):
    results: list[list[dict] | Exception] = [[] for _ in range(8)]

    def one(i: int) -> None:
        try:
            with httpx.Client(base_url=server.base_url, timeout=300) as c:
                r = c.post(
                    "/completion",
                    json={"prompt": f"Number {i}:", "n_predict": 4, "stream": True, "ignore_eos": True},
                )
                results[i] = [json.loads(e) for e in sse_events(r.text)]
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    for res in results:
        assert isinstance(res, list), res
        assert res[-1]["stop"] is True and res[-1]["tokens_predicted"] == 4
    assert _wait_idle(client) == 0
