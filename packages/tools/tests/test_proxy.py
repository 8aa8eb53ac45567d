"""`CorsProxy` against real loopback upstreams with an injected resolver: the connection goes to the address
that was checked (resolved once per connection), the Host header and TLS keep the name, redirects are
relayed and not followed, and a refusal is a 403 `permission_error`."""

from __future__ import annotations

import asyncio
import datetime
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from litestar import Litestar
from litestar.testing import TestClient
from llama_tools import ToolsConfig, ToolsService, tools_route_handlers
from llama_tools.proxy import CorsProxy
from llama_tools.targets import REFUSED_MESSAGE, TargetRefused, parse_allow_list

# a second loopback address: an answer the system resolver never gives for these names
ADDRESS = "127.0.0.2"


class _Recorder(BaseHTTPRequestHandler):
    """Records each request (path, Host, the local address it reached); HTTP/1.0, so one per connection."""

    def do_GET(self):
        self.server.hits.append((self.path, self.headers["Host"], self.connection.getsockname()[0]))  # type: ignore[attr-defined]
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", f"http://{ADDRESS}:{self.server.server_port}/followed")  # type: ignore[attr-defined]
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"reached")

    def log_message(self, *args):
        pass


def _serve(address: str, context: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer((address, 0), _Recorder)
    srv.hits = []  # type: ignore[attr-defined]
    if context is not None:
        srv.socket = context.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def upstream() -> Iterator[ThreadingHTTPServer]:
    srv = _serve(ADDRESS)
    yield srv
    srv.shutdown()
    srv.server_close()


class _Resolver:
    """A resolver whose answers a test sets, one list per call (the last one repeats); it counts calls."""

    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        return self.answers[min(len(self.calls), len(self.answers)) - 1]


async def _get(proxy: CorsProxy, *urls: str) -> list[tuple[int, dict[str, str], bytes] | Exception]:
    """Each URL through one proxy (one shared client, as the server has); an exception is returned."""
    out: list[tuple[int, dict[str, str], bytes] | Exception] = []
    try:
        for url in urls:
            try:
                reply = await proxy.open("GET", url, {}, b"")
                body = b"".join([c async for c in reply.body()])
                out.append((reply.status, {k.lower(): v for k, v in reply.headers}, body))
            except Exception as e:
                out.append(e)
    finally:
        await proxy.aclose()
    return out


def test_connects_to_the_checked_address(upstream):
    """`mcp.test` exists only in the injected resolver: reaching the upstream at the address it gave, with
    the name in Host, shows the socket went to the checked address and nothing resolved it again."""
    port = upstream.server_port
    resolver = _Resolver([ADDRESS])
    proxy = CorsProxy(parse_allow_list("127.0.0.0/8"), resolver)
    [(status, _, body)] = asyncio.run(_get(proxy, f"http://mcp.test:{port}/pinned"))
    assert status == 200 and body == b"reached"
    assert resolver.calls == [("mcp.test", port)]
    assert upstream.hits[-1] == ("/pinned", f"mcp.test:{port}", ADDRESS)


def test_every_connection_is_checked_once(upstream):
    """Rebinding: the next connection's answer is private and not allowed, so that request is refused;
    the first was sent to the first answer, the only one looked up for it."""
    port = upstream.server_port
    resolver = _Resolver([ADDRESS], ["10.0.0.1"])
    proxy = CorsProxy(parse_allow_list(f"{ADDRESS}:{port}"), resolver)
    first, second = asyncio.run(
        _get(proxy, f"http://rebind.test:{port}/one", f"http://rebind.test:{port}/two")
    )
    assert isinstance(first, tuple) and first[0] == 200
    assert isinstance(second, TargetRefused)
    assert len(resolver.calls) == 2  # HTTP/1.0 upstream: a new connection, a new lookup, a new check
    assert [h[0] for h in upstream.hits if h[1].startswith("rebind.test")] == ["/one"]


def test_mixed_answers_are_refused_before_dialing(upstream):
    port = upstream.server_port
    before = len(upstream.hits)
    resolver = _Resolver(["93.184.216.34", ADDRESS])
    [result] = asyncio.run(_get(CorsProxy((), resolver), f"http://mixed.test:{port}/"))
    assert isinstance(result, TargetRefused) and str(result) == REFUSED_MESSAGE
    assert len(upstream.hits) == before


def test_refused_spellings_never_dial(upstream):
    """Each spelling of the upstream's own address is refused without an allow entry, before any lookup;
    `0177.0.0.2` is one httpx itself would not parse."""
    port = upstream.server_port
    before = len(upstream.hits)
    resolver = _Resolver([ADDRESS])
    hosts = ["127.0.0.2", "2130706434", "0x7f000002", "0177.0.0.2", "127.2", "[::ffff:127.0.0.2]", "[::1]"]
    results = asyncio.run(_get(CorsProxy((), resolver), *(f"http://{h}:{port}/" for h in hosts)))
    assert all(isinstance(r, TargetRefused) for r in results), results
    assert resolver.calls == [] and len(upstream.hits) == before


def test_redirect_is_relayed_not_followed(upstream):
    port = upstream.server_port
    proxy = CorsProxy(parse_allow_list(f"{ADDRESS}:{port}"), _Resolver([ADDRESS]))
    [(status, headers, _)] = asyncio.run(_get(proxy, f"http://{ADDRESS}:{port}/redirect"))
    assert status == 302 and headers["location"] == f"http://{ADDRESS}:{port}/followed"
    assert "/followed" not in [h[0] for h in upstream.hits]


def _tls_pair(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A CA and a server certificate for `mcp.test` only: (the server's context, a client trusting the CA)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, key, issuer: str, issuer_key, ca: bool):  # type: ignore[no-untyped-def]
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("test CA", ca_key, "test CA", ca_key, True)
    leaf = cert("mcp.test", leaf_key, "test CA", ca_key, False)
    pem = serialization.Encoding.PEM
    (tmp / "leaf.pem").write_bytes(
        leaf.public_bytes(pem)
        + leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp / "leaf.pem")
    client = ssl.create_default_context(cadata=ca.public_bytes(pem).decode())
    return server, client


def test_tls_uses_the_name_for_sni_and_verification(tmp_path):
    """Dialed at a pinned address, TLS still sends the URL's name as SNI and checks the certificate
    against it: `mcp.test` passes, `other.test` (same address, same certificate) fails verification."""
    server_ctx, client_ctx = _tls_pair(tmp_path)
    sni: list[str | None] = []
    server_ctx.sni_callback = lambda _sock, name, _ctx: sni.append(name)  # type: ignore[assignment]
    srv = _serve(ADDRESS, server_ctx)
    try:
        port = srv.server_port
        proxy = CorsProxy(parse_allow_list(ADDRESS), _Resolver([ADDRESS]), verify=client_ctx)
        good, bad = asyncio.run(_get(proxy, f"https://mcp.test:{port}/tls", f"https://other.test:{port}/tls"))
        assert isinstance(good, tuple) and good[0] == 200 and good[2] == b"reached"
        assert srv.hits == [("/tls", f"mcp.test:{port}", ADDRESS)]  # type: ignore[attr-defined]
        assert isinstance(bad, httpx.ConnectError) and "certificate verify failed" in str(bad)
        assert sni == ["mcp.test", "other.test"]
    finally:
        srv.shutdown()
        srv.server_close()


def test_refusal_is_a_403_permission_error():
    service = ToolsService(ToolsConfig(cors_proxy=True))
    app = Litestar(route_handlers=tools_route_handlers(service), lifespan=[service.lifespan])
    with TestClient(app) as c:
        for url in ("http://127.0.0.1:9/", "http://[::ffff:169.254.169.254]/latest", "http://0x0a000001/"):
            r = c.get("/cors-proxy", params={"url": url})
            assert r.status_code == 403, r.text
            assert r.json() == {
                "error": {"code": 403, "message": REFUSED_MESSAGE, "type": "permission_error"}
            }
