"""The router's own `/cors-proxy` (`--ui-mcp-proxy`) refuses non-public targets as llama-server's does."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import Router, start_router

KEY = "sk-proxy"
AUTH = {"Authorization": f"Bearer {KEY}"}


class _Local(BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.hits.append(self.path)  # type: ignore[attr-defined]
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"reached")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def local() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Local)
    srv.hits = []  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def router(models_dir: Path, cache_env: dict[str, str]) -> Iterator[Router]:
    yield from start_router(
        ["--models-dir", str(models_dir), "--ui-mcp-proxy", "--api-key", KEY], cache_env, KEY
    )


def test_router_proxy_refuses_local_targets(router: Router, local: ThreadingHTTPServer) -> None:
    port = local.server_port
    urls = [
        f"http://{h}:{port}/secret" for h in ("127.0.0.1", "localhost", "2130706433", "[::ffff:127.0.0.1]")
    ]
    urls += [f"{router.url}/health", "http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/"]
    for url in urls:
        r = router.http.get("/cors-proxy", params={"url": url}, headers=AUTH)
        assert r.status_code == 403, (url, r.text)
        err = r.json()["error"]
        assert err["type"] == "permission_error" and "--cors-proxy-allow" in err["message"], r.text
    assert local.hits == []  # type: ignore[attr-defined]
    assert router.http.get("/health").status_code == 200


def test_router_invalid_allow_entry_stops_start_up() -> None:
    from click.testing import CliRunner

    from llama_router.cli import command

    result = CliRunner().invoke(command, ["--ui-mcp-proxy", "--cors-proxy-allow", "10.0.0.0/40"])
    assert result.exit_code == 2 and "--cors-proxy-allow: invalid entry '10.0.0.0/40'" in result.output
