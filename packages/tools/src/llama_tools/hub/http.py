"""The model hub's address and the HTTP client used to talk to it: the access token is attached only to
requests for the hub's own origin (never to a plain URL download, nor to a redirect elsewhere)."""

from __future__ import annotations

import os
from collections.abc import Generator

import httpx

__all__ = ["HubAuth", "HubError", "hub_client", "model_endpoint", "same_origin"]

DEFAULT_ENDPOINT = "https://huggingface.co/"
USER_AGENT = "llama-cpp/llama-tools"


class HubError(Exception):
    """A download or lookup that failed: `code` is the HTTP status to answer with (400 for a bad
    argument, 404 for nothing to download, 500 otherwise)."""

    def __init__(self, message: str, code: int = 500) -> None:
        super().__init__(message)
        self.code = code


def model_endpoint() -> str:
    """`MODEL_ENDPOINT`, else `HF_ENDPOINT`, else Hugging Face; always ending in `/`."""
    endpoint = os.environ.get("MODEL_ENDPOINT") or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    return endpoint if endpoint.endswith("/") else endpoint + "/"


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    port = url.port or {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host, port


def same_origin(a: str | httpx.URL, b: str | httpx.URL) -> bool:
    return _origin(httpx.URL(a)) == _origin(httpx.URL(b))


class HubAuth(httpx.Auth):
    """`Authorization: Bearer <token>` on requests to the hub's origin only. httpx applies auth to the
    first request of a redirect chain and drops the header when a redirect leaves the origin."""

    def __init__(self, endpoint: str, token: str | None) -> None:
        self.endpoint = httpx.URL(endpoint)
        self.token = token or ""

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if self.token and same_origin(request.url, self.endpoint):
            request.headers["Authorization"] = f"Bearer {self.token}"
        else:
            request.headers.pop("Authorization", None)
        yield request


def hub_client(token: str | None = None, endpoint: str | None = None, timeout: float = 30.0) -> httpx.Client:
    """A client for lookups and downloads: redirects followed, no content encoding (byte ranges and the
    advertised length then count the file's own bytes)."""
    return httpx.Client(
        auth=HubAuth(endpoint or model_endpoint(), token),
        follow_redirects=True,
        timeout=httpx.Timeout(timeout, connect=10.0),
        headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
    )
