"""`/cors-proxy` on a real llama-server reaches public addresses only: every spelling of loopback, private,
link-local and metadata addresses answers 403 and a local service is never hit, whatever API key the
caller holds; `--cors-proxy-allow` lets one local service in, and its redirects are relayed, not followed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from conftest import Server, smollm2_path, start_server, stop_server

KEY = "proxy-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
REFUSED = "the target address is not allowed"


class _Local(BaseHTTPRequestHandler):
    """A service on loopback that records every request it gets."""

    def do_GET(self):
        self.server.hits.append(self.path)  # type: ignore[attr-defined]
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/followed")  # type: ignore[attr-defined]
            self.end_headers()
            return
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
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("guarded"), "-c", "256", "-np", "1", "--no-warmup", "--ui-mcp-proxy",
                     "--api-key", KEY)  # fmt: skip
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def allowing(tmp_path_factory: pytest.TempPathFactory, local: ThreadingHTTPServer) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("allowing"), "-c", "256", "-np", "1", "--no-warmup", "--ui-mcp-proxy",
                     "--cors-proxy-allow", f"127.0.0.1:{local.server_port}")  # fmt: skip
    yield s
    stop_server(s)


def _forbidden(port: int, own: str) -> list[str]:
    """The local service (and the server itself) in every spelling, and the usual internal targets."""
    hosts = ["127.0.0.1", "localhost", "0.0.0.0", "2130706433", "0x7f000001", "127.1", "0177.0.0.1",
             "[::ffff:127.0.0.1]", "[::127.0.0.1]", "[::1]", "127.0.0.1."]  # fmt: skip
    return [
        *(f"http://{h}:{port}/secret" for h in hosts),
        f"https://127.0.0.1:{port}/secret",
        f"{own}/health",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://[::ffff:a9fe:a9fe]/latest/meta-data/",
        "http://10.0.0.1/",
        "http://172.16.0.1/",
        "http://192.168.0.1/",
        "http://100.64.0.1/",
        "http://[fe80::1]/",
        "http://[fe80::1%25eth0]/",
        "http://[fc00::1]/",
        "http://[2002:7f00:1::]/",
        "http://224.0.0.1/",
    ]


def test_every_spelling_is_refused(guarded: Server, local: ThreadingHTTPServer):
    """An API key gives no way past the check: the key's holder gets the same 403."""
    before = list(local.hits)  # type: ignore[attr-defined]
    with guarded.client(headers=AUTH) as c:
        for url in _forbidden(local.server_port, guarded.base_url):
            for method in ("GET", "POST"):
                r = c.request(method, "/cors-proxy", params={"url": url}, content=b"{}")
                assert r.status_code == 403, (url, r.text)
                err = r.json()["error"]
                assert err["code"] == 403 and err["type"] == "permission_error", (url, r.text)
                assert REFUSED in err["message"] and "--cors-proxy-allow" in err["message"]
        assert c.get("/health").status_code == 200  # still serving
    assert local.hits == before  # type: ignore[attr-defined]
    assert httpx.get(f"{guarded.base_url}/cors-proxy", params={"url": "http://10.0.0.1/"}).status_code == 401


def test_allowed_local_service(allowing: Server, local: ThreadingHTTPServer):
    port = local.server_port
    before = len(local.hits)  # type: ignore[attr-defined]
    with allowing.client() as c:
        r = c.get("/cors-proxy", params={"url": f"http://127.0.0.1:{port}/ok"})
        assert r.status_code == 200 and r.text == "reached"
        # the redirect comes back to the caller; the proxy does not fetch its target
        r = c.get("/cors-proxy", params={"url": f"http://127.0.0.1:{port}/redirect"})
        assert r.status_code == 302 and r.headers["location"] == f"http://127.0.0.1:{port}/followed"
        # the entry names one port: the server itself, on another, stays out of reach
        r = c.get("/cors-proxy", params={"url": f"{allowing.base_url}/health"})
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        r = c.get("/cors-proxy", params={"url": "http://169.254.169.254/"})
        assert r.status_code == 403
    assert local.hits[before:] == ["/ok", "/redirect"]  # type: ignore[attr-defined]


def test_invalid_allow_entry_stops_start_up():
    from click.testing import CliRunner

    from llama_server.cli import main

    result = CliRunner().invoke(
        main, ["-m", str(smollm2_path()), "--port", "0", "--cors-proxy-allow", "a b,::1"]
    )
    assert result.exit_code == 2, result.output
    assert (
        "--cors-proxy-allow: invalid entry 'a b': not a host name, IP address or CIDR network"
        in result.output
    )
