"""The CORS origin policy (endpoints.md §0.6), one function for both `llama-server` and `llama-router`.

`--cors-origins`: `*` (with credentials, the request's `Origin` is echoed whatever it is), `localhost`
(echo only an origin whose host is `localhost`, `127.0.0.1` or `::1`, any scheme and port), or a literal
value sent as is. The default is `*`, and `localhost` once tools or MCP servers are enabled.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import msgspec

__all__ = ["LOOPBACK_HOSTS", "CorsPolicy", "cors_origins_default"]

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def cors_origins_default(explicit: str | None, tools_enabled: bool) -> str:
    """The effective `--cors-origins`: the given value, else `localhost` with tools/MCP on, else `*`."""
    if explicit is not None:
        return explicit
    return "localhost" if tools_enabled else "*"


def _host_of(origin: str) -> str:
    try:
        return urlsplit(origin if "://" in origin else "//" + origin).hostname or ""
    except ValueError:  # e.g. an unbalanced `[` in the host part
        return ""


def _canonical(origin: str) -> str:
    """`scheme://host[:port]` in lower case, without the scheme's default port or a trailing `/`."""
    origin = origin.strip().removesuffix("/")
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return origin
    if not parts.scheme or not parts.hostname or parts.path or parts.query or parts.fragment:
        return origin
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    suffix = f":{port}" if port is not None and port != default else ""
    return f"{parts.scheme.lower()}://{host}{suffix}"


class CorsPolicy(msgspec.Struct, frozen=True):
    """The `--cors-*` settings, and the headers they add to a response."""

    origins: str = "*"
    methods: str = "GET, POST, DELETE, OPTIONS"
    headers: str = "*"
    credentials: bool = True

    def allow_origin(self, origin: str) -> str | None:
        """The `Access-Control-Allow-Origin` value for a request's `Origin` (None: no header)."""
        if self.origins == "*" and self.credentials:
            return origin or None
        if self.origins == "localhost":
            return origin if origin and _host_of(origin) in LOOPBACK_HOSTS else None
        return self.origins

    def allows(self, origin: str) -> bool:
        """Whether a page of `origin` may act through this server (the edge guard, `guard.py`): any with
        `*`, a loopback one with `localhost`, else exactly the literal value (scheme and host in any case,
        a default port or a trailing `/` ignored)."""
        if not origin:
            return False
        if self.origins == "*":
            return True
        if self.origins == "localhost":
            return _host_of(origin) in LOOPBACK_HOSTS
        return _canonical(origin) == _canonical(self.origins)

    def response_headers(self, origin: str, preflight: bool) -> list[tuple[str, str]]:
        """The CORS headers of one response, in canonical case; the `Allow-*` ones only on OPTIONS."""
        out: list[tuple[str, str]] = []
        allow = self.allow_origin(origin)
        if allow is not None:
            out.append(("Access-Control-Allow-Origin", allow))
        if preflight:
            out.append(("Access-Control-Allow-Credentials", "true" if self.credentials else "false"))
            out.append(("Access-Control-Allow-Methods", self.methods))
            out.append(("Access-Control-Allow-Headers", self.headers))
        return out
