"""Model management through a real router: `POST /models` downloads from a hub stand-in on loopback in a
download-mode child (progress events, the catalogue reloaded, the model then served), cancel through
`/models/unload`, `DELETE /models`; and `llama-server -hf` through the same cache, over a connection that
drops mid-file, with the token sent only to the hub."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SERVER, SMOL, Router, start_router
from hub_server import HubServer, Repo

TOKEN = "hf_" + "b" * 34
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    repos = {name: Repo({FILE: SMOL}) for name in ("org/smol-GGUF", "org/slow-GGUF", "org/cli-GGUF")}
    with HubServer(repos, files={"tiny-Q4_0.gguf": b"GGUF" + b"\0" * 4096}) as h:
        yield h


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dl-cache")


@pytest.fixture(scope="module")
def router(hub: HubServer, cache: Path, models_dir: Path) -> Iterator[Router]:
    env = {"LLAMA_CACHE": str(cache), "MODEL_ENDPOINT": hub.url}
    args = ["--models-dir", str(models_dir), "--hf-token", TOKEN, "--sleep-idle-seconds", "1"]
    yield from start_router(args, env)


class Events:
    """`/models/sse` collected in a thread, from before the action under test."""

    def __init__(self, router: Router) -> None:
        self.items: list[dict[str, Any]] = []
        ready = threading.Event()

        def listen() -> None:
            try:
                with httpx.stream("GET", router.url + "/models/sse", timeout=120) as resp:
                    ready.set()
                    for line in resp.iter_lines():
                        if line.startswith("data: "):
                            self.items.append(json.loads(line[6:]))
            except httpx.HTTPError:
                return  # the router shut down

        threading.Thread(target=listen, daemon=True).start()
        assert ready.wait(10)

    def wait(self, model: str, event: str, timeout: float = 120) -> list[dict[str, Any]]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(e["model"] == model and e["event"] == event for e in self.items):
                return [e for e in self.items if e["model"] == model]
            time.sleep(0.05)
        raise AssertionError(f"no {event} for {model}: {self.items[-5:]}")


def _item(router: Router, name: str) -> dict[str, Any] | None:
    return next((m for m in router.http.get("/models").json()["data"] if m["id"] == name), None)


def test_download_then_serve_then_delete(router: Router, hub: HubServer, cache: Path) -> None:
    events = Events(router)
    r = router.http.post("/models", json={"model": "org/smol-GGUF:q4_1"})
    assert r.status_code == 200 and r.json() == {"success": True}
    name = "org/smol-GGUF:Q4_1"
    mine = events.wait(name, "download_finished")
    assert mine[0] == {"model": name, "event": "model_status", "data": {"status": "downloading"}}
    progress = [e["data"]["progress"] for e in mine if e["event"] == "download_progress"]
    assert progress and list(progress[-1].values())[-1] == {
        "done": SMOL.stat().st_size,
        "total": SMOL.stat().st_size,
    }
    events.wait("*", "models_reload")
    router.wait_status(name, {"unloaded"})
    item = _item(router, name)
    assert item and item["source"] == "cache" and item["can_remove"] is True
    assert TOKEN not in json.dumps(item) and TOKEN not in "".join(router.log)
    assert all(h.get("authorization") == f"Bearer {TOKEN}" for _, _, h in hub.log)
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = router.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    # the child sleeps when idle (--sleep-idle-seconds reaches every child); a request wakes it
    router.wait_status(name, {"sleeping"})
    assert router.http.get("/props", params={"model": name}).json()["is_sleeping"] is True
    assert router.status(name) == "sleeping"
    r = router.http.post("/tokenize", json={"model": name, "content": "hi"})
    assert r.status_code == 200 and r.json()["tokens"]
    router.wait_status(name, {"loaded"}, timeout=10)
    r = router.http.post("/models", json={"model": name})
    assert r.status_code == 400 and r.json()["error"]["message"] == f"model '{name}' already exists"
    assert router.http.delete("/models", params={"model": name}).status_code == 200
    events.wait(name, "model_remove")
    assert _item(router, name) is None and not list(cache.rglob("*.gguf"))


def test_download_errors(router: Router) -> None:
    for spec, code in (("", 400), ("../x", 400), ("org/none-GGUF", 400), ("org/smol-GGUF:Q8_0", 400)):
        r = router.http.post("/models", json={"model": spec})
        assert r.status_code == code, (spec, r.text)
    assert router.http.delete("/models").status_code == 400
    r = router.http.delete("/models", params={"model": "nope"})
    assert r.status_code == 500 and r.json()["error"]["message"] == "model name=nope is not found"
    r = router.http.delete("/models", params={"model": "model-a"})
    assert r.json()["error"]["message"] == "model name=model-a is not removable (not from cache)"
    assert router.http.get("/health").status_code == 200


def test_url_download(router: Router, hub: HubServer) -> None:
    """A plain URL lands in the cache under its file name."""
    events = Events(router)
    assert router.http.post("/models", json={"model": hub.url + "files/tiny-Q4_0.gguf"}).status_code == 200
    events.wait("tiny-Q4_0", "download_finished")
    events.wait("*", "models_reload")
    item = _item(router, "tiny-Q4_0")
    assert item and item["source"] == "cache" and item["status"]["value"] == "unloaded"
    assert router.http.delete("/models", params={"model": "tiny-Q4_0"}).status_code == 200
    assert _item(router, "tiny-Q4_0") is None
    r = router.http.post("/models", json={"model": hub.url + "files/..%2Fescape.gguf"})
    assert r.status_code == 400


def test_cancel_download(router: Router, hub: HubServer, cache: Path) -> None:
    hub.slow.add(FILE)
    try:
        events = Events(router)
        assert router.http.post("/models", json={"model": "org/slow-GGUF"}).status_code == 200
        events.wait("org/slow-GGUF", "download_progress")
        assert router.status("org/slow-GGUF") == "downloading"
        r = router.http.post("/models/unload", json={"model": "org/slow-GGUF"})
        assert r.status_code == 200
        assert router.status("org/slow-GGUF") != "downloading"  # the call waited for the cancel
        events.wait("org/slow-GGUF", "download_failed")
        events.wait("*", "models_reload")
        assert _item(router, "org/slow-GGUF") is None
        assert not [p for p in cache.rglob("*") if p.is_file() and "slow" in str(p)]
    finally:
        hub.slow.discard(FILE)


def test_server_hf_flag(hub: HubServer, cache: Path, tmp_path: Path) -> None:
    """`llama-server -hf` downloads into the same cache, resuming a dropped connection."""
    hub.drops[FILE] = 1
    n = len(hub.log)
    env = {**os.environ, "LLAMA_CACHE": str(tmp_path), "MODEL_ENDPOINT": hub.url}
    args = [SERVER, "-hf", "org/cli-GGUF:Q4_1", "-hft", TOKEN, "--port", "0", "-c", "256", "-np", "1"]
    proc = subprocess.Popen([*args, "--no-warmup"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "loading " in line and "slots" in line:
                break
        assert proc.poll() is None, "".join(lines)
        path = line.split("loading ")[1].split(" (slots")[0]
        assert path.startswith(str(tmp_path)) and Path(path).read_bytes() == SMOL.read_bytes()
        gets = [h for m, p, h in hub.log[n:] if m == "GET" and p.endswith(FILE)]
        assert len(gets) == 2 and gets[1]["range"].startswith("bytes=")
        assert all(h.get("authorization") == f"Bearer {TOKEN}" for _, _, h in hub.log[n:])
    finally:
        proc.terminate()
        proc.wait(30)
    env["LLAMA_ARG_OFFLINE"] = "1"
    env["MODEL_ENDPOINT"] = "http://127.0.0.1:9/"  # nothing there: offline must not ask
    r = subprocess.run(
        [SERVER, "-hf", "org/none-GGUF", "--port", "0"], env=env, capture_output=True, text=True
    )
    assert r.returncode != 0 and "not available in the cache (offline mode)" in r.stderr
