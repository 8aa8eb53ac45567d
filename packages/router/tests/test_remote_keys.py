"""Remote replicas protected by an API key: the router sends each replica its own configured key (preset
`remote-api-key` / `remote-api-key-file`, or `--remote-api-key`), on proxied requests and health checks,
and never a client's key; keys stay out of `GET /models` and the log; a key count that does not match the
URLs stops the router at startup."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from conftest import SERVER, SMOL, Router, start_router

REPLICA_KEY = "replica-secret-4f1c9a"
FILE_KEY = "filed-secret-77d02b"
ROUTER_KEY = "router-secret-0be3e1"
CLI_KEY = "cli-secret-5a6e90"
BODY = {"prompt": "Hello", "n_predict": 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def protected() -> Iterator[str]:
    """A llama-server that requires REPLICA_KEY."""
    port = _free_port()
    args = [
        "-m",
        str(SMOL),
        "--port",
        str(port),
        "-c",
        "512",
        "-np",
        "2",
        "--no-warmup",
        "--api-key",
        REPLICA_KEY,
    ]
    proc = subprocess.Popen([SERVER, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        yield url
    finally:
        proc.kill()
        proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("the protected replica did not start")


class _Recorder(BaseHTTPRequestHandler):
    """A stand-in replica that answers every route and records the headers it was sent."""

    seen: ClassVar[list[tuple[str, str, dict[str, str]]]] = []

    def _answer(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        if n:
            self.rfile.read(n)
        self.seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
        body = json.dumps({"content": "stand-in", "data": []}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def recorder() -> Iterator[tuple[str, list[tuple[str, str, dict[str, str]]]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def router(
    tmp_path_factory: pytest.TempPathFactory,
    protected: str,
    recorder: tuple[str, Any],
    cache_env: dict[str, str],
) -> Iterator[Router]:
    tmp = tmp_path_factory.mktemp("remote-keys")
    (tmp / "keys.txt").write_text(f"# the stand-in's key\n\n{FILE_KEY}\n")
    preset = tmp / "models.ini"
    preset.write_text(
        f"[guarded]\nremote = {protected}\nremote-api-key = {REPLICA_KEY}\n\n"
        f"[unkeyed]\nremote = {protected}\nremote-api-key =\n\n"  # explicitly none: the CLI key is not used
        f"[via-cli]\nremote = {protected}\n\n"
        f"[recorded]\nremote = {recorder[0]}\nremote-api-key-file = {tmp / 'keys.txt'}\n"
    )
    env = {**cache_env, "LLAMA_ARG_REPLICA_CHECK_INTERVAL": "0.3", "LLAMA_ARG_REMOTE_API_KEY": REPLICA_KEY}
    yield from start_router(["--models-preset", str(preset), "--api-key", ROUTER_KEY], env, ROUTER_KEY)


def test_replica_reached_with_its_key(router: Router, protected: str) -> None:
    for model in ("guarded", "via-cli"):  # the preset's key, and --remote-api-key for an entry with none
        assert router.wait_status(model, {"loaded"}, timeout=10) == "loaded"
        r = router.http.post("/completion", json={"model": model, **BODY}, headers=router.auth)
        assert r.status_code == 200, r.text
        assert r.json()["tokens_predicted"] == 2
    # the router's own key alone would have been refused there: the replica got its own key
    assert httpx.post(protected + "/completion", json=BODY, headers=router.auth).status_code == 401


def test_replica_without_its_key_is_out(router: Router) -> None:
    assert router.wait_status("unkeyed", {"unloaded"}, timeout=10) == "unloaded"
    r = router.http.post("/completion", json={"model": "unkeyed", **BODY}, headers=router.auth)
    assert r.status_code == 503 and "no healthy replica" in r.json()["error"]["message"]
    assert any("of unkeyed is out: it requires an API key" in line for line in router.log)


def test_client_keys_never_reach_a_replica(router: Router, recorder: tuple[str, Any]) -> None:
    _, seen = recorder
    router.wait_status("recorded", {"loaded"}, timeout=10)
    headers = {**router.auth, "x-api-key": ROUTER_KEY}
    r = router.http.post("/completion", json={"model": "recorded", **BODY}, headers=headers)
    assert r.status_code == 200 and r.json()["content"] == "stand-in"
    paths = {path for _, path, _ in seen}
    assert {"/health", "/v1/models", "/completion"} <= paths  # health checks and the proxied request
    for _, path, sent in seen:
        assert sent.get("authorization") == f"Bearer {FILE_KEY}", path
        assert "x-api-key" not in sent
        assert ROUTER_KEY not in json.dumps(sent)


def test_keys_stay_out_of_models_and_log(router: Router) -> None:
    text = router.http.get("/models", headers=router.auth).text
    listed = {m["id"]: m for m in json.loads(text)["data"]}
    assert (
        listed["guarded"]["status"]["args"] and "remote-api-key" not in listed["guarded"]["status"]["preset"]
    )
    for secret in (REPLICA_KEY, FILE_KEY, ROUTER_KEY):
        assert secret not in text
        assert not any(secret in line for line in router.log)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("remote = http://127.0.0.1:9, http://127.0.0.1:10, http://127.0.0.1:11\nremote-api-key = k1x, k2x",
         "preset 'bad': 2 remote API keys for 3 remote URLs"),
        ("remote = http://127.0.0.1:9\nremote-api-key-file = /nonexistent/keys.txt",
         "cannot read API key file /nonexistent/keys.txt"),
        ("model = /x.gguf\nremote-api-key = k1x", "remote-api-key(-file) is only for an entry with remote"),
        ("remote = http://127.0.0.1:9\nremote-api-key = k1x\nremote-api-key-file = /x", "not both"),
    ],
)  # fmt: skip
def test_bad_remote_keys_stop_the_router(
    tmp_path: Path, cache_env: dict[str, str], section: str, message: str
) -> None:
    preset = tmp_path / "models.ini"
    preset.write_text(f"[bad]\n{section}\n")
    with pytest.raises(RuntimeError) as err:
        Router(["--models-preset", str(preset)], cache_env)
    assert message in str(err.value)
    assert "k1x" not in str(err.value) and "k2x" not in str(err.value)
