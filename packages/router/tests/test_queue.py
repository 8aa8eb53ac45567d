"""The load queue with `--models-max 1` (router.md §6), widened by LLAMA_SERVER_DEBUG_FAKE_TIMING (2 s per
load and per proxied request), as llama.cpp's own router tests do."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Router, start_router


@pytest.fixture(scope="module")
def router(models_dir: Path, cache_env: dict[str, str]) -> Iterator[Router]:
    env = {**cache_env, "LLAMA_SERVER_DEBUG_FAKE_TIMING": "1"}
    yield from start_router(["--models-dir", str(models_dir), "--models-max", "1"], env)


class _Bg(threading.Thread):
    def __init__(self, router: Router, model: str, timeout: float = 120) -> None:
        super().__init__(daemon=True)
        self.router, self.model, self.timeout = router, model, timeout
        self.result: Any = None
        self.done_at = 0.0
        self.start()

    def run(self) -> None:
        try:
            self.result = httpx.post(
                self.router.url + "/tokenize",
                json={"model": self.model, "content": "hi"},
                timeout=self.timeout,
            )
        except httpx.HTTPError as e:
            self.result = e
        self.done_at = time.time()

    def ok(self) -> bool:
        self.join(180)
        return isinstance(self.result, httpx.Response) and self.result.status_code == 200


def _only(router: Router, model: str) -> None:
    if router.status(model) != "loaded":
        router.load(model)


def test_busy_model_is_not_evicted_and_fifo(router: Router) -> None:
    _only(router, "model-a")
    busy = _Bg(router, "model-a")
    time.sleep(0.5)
    first = _Bg(router, "model-b")
    time.sleep(1)
    second = _Bg(router, "model-c")
    assert busy.ok() and first.ok() and second.ok()
    assert first.done_at < second.done_at  # served in arrival order
    assert router.status("model-a") == "unloaded"


def test_two_waiters_share_one_eviction(router: Router) -> None:
    _only(router, "model-a")
    first, second = _Bg(router, "model-b"), _Bg(router, "model-c")
    assert first.ok() and second.ok()
    assert router.status("model-a") == "unloaded"


def test_client_leaving_the_queue_keeps_the_model(router: Router) -> None:
    _only(router, "model-a")
    busy = _Bg(router, "model-a")
    time.sleep(0.5)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(router.url + "/tokenize", json={"model": "model-b", "content": "x"}, timeout=1)
    assert busy.ok()
    time.sleep(1)
    assert router.status("model-a") == "loaded" and router.status("model-b") == "unloaded"
