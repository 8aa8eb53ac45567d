"""`/cors-proxy?url=...` (streams-and-tools.md §4): the web UI reaches remote MCP servers through it.

Only headers named `x-llama-server-proxy-header-<name>` go out (as `<name>`): the caller's
Authorization, Cookie or API key never reach the target. The target's status, headers (minus hop-by-hop
and `access-control-*` ones) and body come back streamed; a bodyless status such as 204 stays bodyless.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import httpx

__all__ = ["CorsProxy", "ProxyError", "ProxyReply"]

log = logging.getLogger("llama_tools")

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600.0
_DROPPED = frozenset({"server", "transfer-encoding", "content-length", "keep-alive", "connection", "date"})
_BODYLESS = frozenset({204, 304})


class ProxyError(Exception):
    """A target URL the proxy refuses (HTTP 500 with this message)."""


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


def check_target(url: str) -> str:
    """The URL to fetch: http(s), with a host and no password in it."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        password = parts.password
    except ValueError as e:
        raise ProxyError(f"invalid target URL: {e}") from None
    if not host:
        raise ProxyError("invalid target URL: missing host")
    if password:
        raise ProxyError("authentication in target URL is not supported")
    if parts.scheme not in ("http", "https"):
        raise ProxyError(f"unsupported URL scheme in target URL: {parts.scheme}")
    return url


def forwarded_headers(headers: Mapping[str, str] | list[tuple[str, str]]) -> dict[str, str]:
    """The request headers the target gets: only the explicitly proxied ones, renamed."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = {}
    for key, value in items:
        if key.lower().startswith(PREFIX) and len(key) > len(PREFIX):
            out[key[len(PREFIX) :]] = value
    return out


class CorsProxy:
    """One shared HTTP client (connection reuse); `aclose()` on shutdown."""

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None

    async def open(
        self, method: str, url: str, headers: Mapping[str, str] | list[tuple[str, str]], body: bytes
    ) -> ProxyReply:
        """Send the request; raises ProxyError for a refused URL and httpx.HTTPError when it fails."""
        target = check_target(url)
        if self._client is None:
            # no environment proxies, no redirects followed: the caller sees the target's own answer
            self._client = httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False, trust_env=False)
        out = forwarded_headers(headers)
        out.setdefault("accept-encoding", "identity")  # the body is relayed as is, headers included
        try:
            request = self._client.build_request(method, target, headers=out, content=body or None)
        except (httpx.InvalidURL, ValueError) as e:
            raise ProxyError(f"invalid target URL: {e}") from None
        log.info("proxying %s request to %s", method, target.split("?", 1)[0])
        return ProxyReply(await self._client.send(request, stream=True))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
