"""`/cors-proxy?url=...` (streams-and-tools.md §4): the web UI reaches remote MCP servers through it.

Only headers named `x-llama-server-proxy-header-<name>` go out (as `<name>`): the caller's
Authorization, Cookie or API key never reach the target. The target's status, headers (minus hop-by-hop
and `access-control-*` ones) and body come back streamed; a bodyless status such as 204 stays bodyless.

The proxy reaches public addresses only, plus `--cors-proxy-allow` (see `targets.py`). The check sits in
the connection's own dialer: the host is resolved once, every address checked, and the socket connects to
a checked address, while the URL keeps its name, so the Host header, TLS SNI and certificate verification
all use the name as written. Redirects are relayed to the caller, never followed.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import typing
from collections.abc import AsyncIterator, Iterable, Mapping
from urllib.parse import urlsplit

import httpcore
import httpx

from .targets import AllowEntry, Resolver, TargetPolicy, TargetRefused, system_resolver

__all__ = ["CorsProxy", "ProxyError", "ProxyReply", "TargetRefused"]

log = logging.getLogger("llama_tools")

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600.0
_DROPPED = frozenset({"server", "transfer-encoding", "content-length", "keep-alive", "connection", "date"})
_BODYLESS = frozenset({204, 304})
_DEFAULT_PORTS = {"http": 80, "https": 443}


class ProxyError(Exception):
    """An invalid target URL (HTTP 500 with this message)."""


class ProxyReply:
    """The target's answer: status, headers to relay, and the body as it arrives."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status = response.status_code
        self.headers = [
            (k, v)
            for k, v in response.headers.multi_items()
            if k.lower() not in _DROPPED and not k.lower().startswith("access-control-")
        ]
        self.bodyless = self.status in _BODYLESS or self.status < 200

    async def body(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.response.aiter_raw():
                yield chunk
        finally:
            await self.response.aclose()

    async def aclose(self) -> None:
        await self.response.aclose()


def check_target(url: str) -> tuple[str, int]:
    """The host and port of the URL to fetch: http(s), with a host and no password in it."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        password = parts.password
        port = parts.port
    except ValueError as e:
        raise ProxyError(f"invalid target URL: {e}") from None
    if not host:
        raise ProxyError("invalid target URL: missing host")
    if password:
        raise ProxyError("authentication in target URL is not supported")
    if parts.scheme not in ("http", "https"):
        raise ProxyError(f"unsupported URL scheme in target URL: {parts.scheme}")
    return host, port or _DEFAULT_PORTS[parts.scheme]


def forwarded_headers(headers: Mapping[str, str] | list[tuple[str, str]]) -> dict[str, str]:
    """The request headers the target gets: only the explicitly proxied ones, renamed."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = {}
    for key, value in items:
        if key.lower().startswith(PREFIX) and len(key) > len(PREFIX):
            out[key[len(PREFIX) :]] = value
    return out


class _CheckedDialer(httpcore.AsyncNetworkBackend):
    """httpcore's dialer with the address check in front: resolve once, check all, connect to a checked one.

    httpcore hands it the URL's host name and port when it opens a new connection (a pooled connection
    was dialed, and checked, the same way), then starts TLS on the returned stream with that same name.
    """

    def __init__(self, policy: TargetPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                addresses = await self._policy.addresses(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"{host}: name resolution timed out") from None
        except OSError as e:  # name resolution failed: a network failure like any other
            raise httpcore.ConnectError(f"{host}: {e.strerror or e}") from None
        failure: Exception | None = None
        for address in addresses:  # every one was checked; try them in the resolver's order
            try:
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                failure = e
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: typing.Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not proxied")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _transport(policy: TargetPolicy, verify: ssl.SSLContext | bool) -> httpx.AsyncHTTPTransport:
    """httpx's transport over a connection pool that dials through `_CheckedDialer` (httpx takes no dialer
    of its own, so its pool is replaced by an equal one that has it)."""
    context = httpx.create_ssl_context(verify=verify, trust_env=False)
    transport = httpx.AsyncHTTPTransport(verify=context, trust_env=False)
    transport._pool = httpcore.AsyncConnectionPool(  # httpx's default limits
        ssl_context=context,
        max_connections=100,
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        network_backend=_CheckedDialer(policy),
    )
    return transport


class CorsProxy:
    """One shared HTTP client (connection reuse); `aclose()` on shutdown.

    `allow`: the parsed `--cors-proxy-allow`. `resolver`: how host names become addresses (the system's
    by default). `verify`: TLS verification of the targets (default: the system's trust store).
    """

    def __init__(
        self,
        allow: tuple[AllowEntry, ...] = (),
        resolver: Resolver = system_resolver,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.policy = TargetPolicy(allow, resolver)
        self._verify = verify
        self._client: httpx.AsyncClient | None = None

    async def open(
        self, method: str, url: str, headers: Mapping[str, str] | list[tuple[str, str]], body: bytes
    ) -> ProxyReply:
        """Send the request; raises ProxyError for an invalid URL, TargetRefused for an address the proxy
        may not reach, and httpx.HTTPError when it fails."""
        host, port = check_target(url)
        self.policy.check_literal(host, port)  # refused even where httpx would not parse the spelling
        if self._client is None:
            # no environment proxies, no redirects followed: the caller sees the target's own answer
            self._client = httpx.AsyncClient(
                transport=_transport(self.policy, self._verify),
                timeout=TIMEOUT_S,
                follow_redirects=False,
                trust_env=False,  # an environment proxy would dial past the address check
            )
        out = forwarded_headers(headers)
        out.setdefault("accept-encoding", "identity")  # the body is relayed as is, headers included
        try:
            request = self._client.build_request(method, url, headers=out, content=body or None)
        except (httpx.InvalidURL, ValueError) as e:
            raise ProxyError(f"invalid target URL: {e}") from None
        log.info("proxying %s request to %s", method, url.split("?", 1)[0])
        return ProxyReply(await self._client.send(request, stream=True))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
