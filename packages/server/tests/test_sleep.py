"""Sleep mode against a real server (`--sleep-idle-seconds 1`): the model is released when idle;
health, props, models and metrics answer from the sleep's snapshot without waking it; tokenize and a
completion wake it, and the reloaded model answers as before."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Server, start_server, stop_server

KEY = {"Authorization": "Bearer sk-sleep"}


@pytest.fixture(scope="module")
def sleepy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("sleep")
    args = ("--sleep-idle-seconds", "1", "--metrics", "-c", "512", "-np", "1", "--api-key", "sk-sleep")
    server = start_server(tmp, *args)
    yield server
    stop_server(server)


def _sleeping(c: httpx.Client) -> bool:
    return bool(c.get("/props", headers=KEY).json()["is_sleeping"])


def _wait_asleep(c: httpx.Client, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _sleeping(c):
            return
        time.sleep(0.2)
    raise AssertionError("the server never fell asleep")


def _metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(f"llamacpp:{name} "))
    return float(line.split()[1])


def test_sleep_and_wake(sleepy: Server) -> None:
    body = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}
    with sleepy.client() as c:
        first = c.post("/completion", json=body, headers=KEY).json()["content"]
        assert not _sleeping(c)
        models = c.get("/v1/models", headers=KEY).json()
        _wait_asleep(c)
        # /props answers from the snapshot as soon as the sleep begins; the line follows the release
        deadline = time.monotonic() + 20
        while "sleeping after" not in sleepy.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "sleeping after" in sleepy.log.read_text()
        # none of these wake it
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/v1/models", headers=KEY).json() == models
        assert c.get("/props").status_code == 401  # the snapshot is behind the key like the live answer
        m1 = c.get("/metrics", headers=KEY).text
        m2 = c.get("/metrics", headers=KEY).text
        assert _metric(m1, "tokens_predicted_total") == _metric(m2, "tokens_predicted_total") >= 7
        assert _metric(m2, "predicted_tokens_seconds") == 0
        time.sleep(0.3)
        assert _sleeping(c)
        # token counting wakes it (without resetting the idle clock), then it falls asleep again
        r = c.post("/tokenize", json={"content": "hello world"}, headers=KEY)
        assert r.status_code == 200 and r.json()["tokens"]
        assert not _sleeping(c)
        _wait_asleep(c)
        steps = _metric(c.get("/metrics", headers=KEY).text, "n_decode_total")
        again = c.post("/completion", json=body, headers=KEY).json()["content"]
        assert again == first  # the same model, reloaded with the same parameters
        assert not _sleeping(c)
        assert _metric(c.get("/metrics", headers=KEY).text, "n_decode_total") > steps
    assert sleepy.log.read_text().count("woke up") == 2


def test_sleep_idle_seconds_validated(tmp_path: Path) -> None:
    for bad in ("0", "-2"):
        r = subprocess.run(
            [sys.executable, "-m", "llama_server", "--sleep-idle-seconds", bad, "--port", "0"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode != 0 and "--sleep-idle-seconds must be" in r.stderr
