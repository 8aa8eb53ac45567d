"""Through one real router: resumable streams routed by `X-Conversation-Id` (replay, lookup, stop, 503
while the owner loads, a stop cancelling the parked request), remote replicas (two llama-servers on
loopback standing in for hosts, one killed and brought back), and the `--max-queue` 503."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SERVER, SMOL, Router, start_router

CHAT = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 24, "stream": True}


class Replica:
    """A llama-server on a fixed loopback port, which a test can kill and start again."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Replica:
        args = [
            "-m",
            str(SMOL),
            "--port",
            str(self.port),
            "-c",
            "512",
            "-np",
            "2",
            "--no-warmup",
            "--metrics",
        ]
        self.proc = subprocess.Popen([SERVER, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def wait(self) -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"replica on {self.port} did not start")

    def predicted(self) -> float:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return float(
            next(x for x in text.splitlines() if x.startswith("llamacpp:tokens_predicted_total ")).split()[1]
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[Replica]]:
    reps = [Replica(_free_port()).start() for _ in range(2)]
    try:
        for r in reps:
            r.wait()
        yield reps
    finally:
        for r in reps:
            r.kill()


@pytest.fixture(scope="module")
def router(
    replicas: list[Replica],
    models_dir: Path,
    cache_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Router]:
    preset = tmp_path_factory.mktemp("preset") / "models.ini"
    preset.write_text(f"[remote-smol]\nremote = {replicas[0].url}, {replicas[1].url}\n")
    args = ["--models-dir", str(models_dir), "--models-preset", str(preset), "--models-max", "1",
            "--max-queue", "1"]  # fmt: skip
    yield from start_router(args, {**cache_env, "LLAMA_ARG_REPLICA_CHECK_INTERVAL": "0.3"})


def _sse_data(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_resumable_stream_through_the_router(router: Router) -> None:
    conv = "conv-1::model-a"
    with router.http.stream(
        "POST", "/v1/chat/completions", json={**CHAT, "model": "model-a"}, headers={"X-Conversation-Id": conv}
    ) as resp:
        assert resp.status_code == 200
        for _ in resp.iter_lines():
            break  # the client goes away after the first line: the child keeps generating
    found = router.http.post("/v1/streams/lookup", json={"conversation_ids": [conv, "other"]}).json()
    assert [e["conversation_id"] for e in found] == [conv]
    r = router.http.get("/v1/stream", params={"conv_id": conv, "from": 0})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    data = _sse_data(r.text)
    assert data[-1] == "[DONE]" and any(json.loads(d)["choices"] for d in data[:-1])
    half = len(r.content) // 2
    tail = router.http.get("/v1/stream", params={"conv_id": conv, "from": half})
    assert tail.content == r.content[half:]  # a resume from a byte offset
    assert router.http.delete("/v1/stream", params={"conv_id": conv}).status_code == 204
    assert router.http.get("/v1/stream", params={"conv_id": "never::model-a"}).status_code == 404


def test_stream_owner_loading_and_stop_while_parked(router: Router) -> None:
    router.http.post("/models/unload", json={"model": "model-a"})
    router.wait_status("model-a", {"unloaded"})
    conv = "conv-2::model-b"
    result: dict[str, Any] = {}

    def post() -> None:
        r = router.http.post(
            "/v1/chat/completions", json={**CHAT, "model": "model-b"}, headers={"X-Conversation-Id": conv}
        )
        result["status"], result["body"] = r.status_code, r.text

    t = threading.Thread(target=post)
    t.start()
    router.wait_status("model-b", {"loading"})
    r = router.http.get("/v1/stream", params={"conv_id": conv})
    assert (
        r.status_code == 503 and r.json()["error"]["message"] == "Stream owner model is loading, retry later"
    )
    assert router.http.delete("/v1/stream", params={"conv_id": conv}).status_code == 204
    t.join(120)
    assert result["status"] == 400
    assert (
        json.loads(result["body"])["error"]["message"]
        == "request cancelled by a stop while the model was loading"
    )


def test_max_queue_answers_503(router: Router) -> None:
    if router.status("model-c") != "unloaded":
        router.http.post("/models/unload", json={"model": "model-c"})
        router.wait_status("model-c", {"unloaded"})
    first: dict[str, int] = {}
    t = threading.Thread(target=lambda: first.update(code=router.http.post(
        "/tokenize", json={"model": "model-c", "content": "x"}).status_code))  # fmt: skip
    t.start()
    router.wait_status("model-c", {"loading"})
    r = router.http.post("/tokenize", json={"model": "model-c", "content": "y"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "unavailable_error"
    t.join(120)
    assert first["code"] == 200  # the one that waited is served


def test_remote_replicas_balanced_and_recovering(router: Router, replicas: list[Replica]) -> None:
    body = {"model": "remote-smol", "prompt": "Hello", "n_predict": 2}
    before = [r.predicted() for r in replicas]
    for _ in range(4):
        assert router.http.post("/completion", json=body).status_code == 200
    after = [r.predicted() for r in replicas]
    assert all(a > b for a, b in zip(after, before, strict=True))  # both replicas served
    replicas[0].kill()
    for _ in range(3):  # the dead replica is skipped at once, the other serves
        assert router.http.post("/completion", json=body).status_code == 200
    assert router.status("remote-smol") == "loaded"
    replicas[0].start().wait()
    time.sleep(1.0)  # a few health checks (every 0.3 s) put it back
    base = replicas[0].predicted()
    for _ in range(4):
        assert router.http.post("/completion", json=body).status_code == 200
    assert replicas[0].predicted() > base
    replicas[1].kill()
    replicas[0].kill()
    r = router.http.post("/completion", json=body)
    assert r.status_code == 503 and "no healthy replica" in r.json()["error"]["message"]
    router.wait_status("remote-smol", {"unloaded"}, timeout=10)
    assert router.http.get("/health").status_code == 200
