"""The cross-site and DNS-rebinding guard of the routes that act on the machine, one implementation for
the edges of `llama-server` and `llama-router`.

CORS headers only decide whether a page may *read* an answer; a "simple" request (a POST with
`Content-Type: text/plain`, form-urlencoded or none) is sent without a preflight, and runs. So before any
body is read, a request to a guarded route (`guard_kind`) must pass, in this order:

- Host (DNS rebinding, as Jupyter's guard): the hostname of the `Host` header (port, IPv6 brackets and a
  trailing dot removed, any case) is an IP literal (rebinding always goes through a DNS name),
  `localhost`, a `--host` value, or, when the server listens on a wildcard or non-loopback address, one of
  the machine's own names (`socket.gethostname()`, `socket.getfqdn()`). No Host header passes; on a Unix
  socket the check is off (a browser cannot reach one).
- Origin: none (not a browser) passes; `null` is refused; otherwise the `--cors-origins` policy must
  allow it (`CorsPolicy.allows`), or it is the request's own origin (its host and port are the Host
  header's, which passed above).
- Content-Type (not for `/cors-proxy`, which relays any body): `application/json`, any parameters; no
  Content-Type only with an empty body.

A refusal is 403 `permission_error` (Host, Origin) or 415 `invalid_request_error` (Content-Type). The edges
skip the guard for a request authenticated by an API key (`--api-key`): a browser cannot send one
cross-site without a preflight.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from .cors import CorsPolicy

__all__ = [
    "GUARD_FULL",
    "GUARD_ORIGIN",
    "Refusal",
    "RequestGuard",
    "guard_kind",
    "is_ip_literal",
    "machine_names",
    "origin_parts",
    "split_host",
]

GUARD_FULL = "full"  # Host, Origin and Content-Type
GUARD_ORIGIN = "origin"  # Host and Origin only

# POST routes that act on the machine: llama-server's (tools, slot files, LoRA scales, props) and
# llama-router's (its tools, model loads, unloads and downloads; slots, LoRA and props go to a child)
_POST = frozenset({"/tools", "/lora-adapters", "/props", "/models", "/models/load", "/models/unload"})
_DELETE = frozenset({"/models"})  # the router: removes a model from the cache
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})


def guard_kind(method: str, path: str) -> str | None:
    """Which checks a request needs: GUARD_FULL, GUARD_ORIGIN (`/cors-proxy`) or None (unguarded).
    `path` is the route's path (without `--api-prefix`); repeated slashes, dot segments and a trailing
    slash are ignored, as the routers may."""
    if method == "OPTIONS":
        return None
    if "//" in path or "/." in path or not path.startswith("/") or (path.endswith("/") and path != "/"):
        path = posixpath.normpath(re.sub("/+", "/", "/" + path))
    if path == "/cors-proxy":
        return GUARD_ORIGIN
    if method == "POST" and (path in _POST or path.startswith("/slots/")):
        return GUARD_FULL
    if method == "DELETE" and path in _DELETE:
        return GUARD_FULL
    return None


def _name(value: str) -> str | None:
    """A hostname in canonical form (lower case, one trailing dot dropped), None when it is no name."""
    value = value.lower()
    value = value.removesuffix(".")
    return value if _NAME.fullmatch(value) else None


def _ipv6(value: str) -> str | None:
    """An IPv6 address (zone id, `%25eth0` or `%eth0`, dropped) in compressed form, None if it is none."""
    addr = value.split("%", 1)[0]
    try:
        return ipaddress.IPv6Address(addr).compressed
    except ValueError:
        return None


def split_host(value: str) -> tuple[str, int | None] | None:
    """The (hostname, port) of a `Host` header: `[::1]:8080` -> ("::1", 8080), `LOCALHOST.` ->
    ("localhost", None); ("", None) for an empty one; None when malformed."""
    value = value.strip()
    if not value:
        return "", None
    if value.startswith("["):
        end = value.find("]")
        host = _ipv6(value[1:end]) if end > 0 else None
        rest = value[end + 1 :] if end > 0 else ""
        if host is None or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:]
    elif value.count(":") > 1:  # an IPv6 address without brackets (and so without a port)
        host, port_text = _ipv6(value), ""
        if host is None:
            return None
    else:
        name, _, port_text = value.partition(":")
        host = _name(name)
        if host is None:
            return None
    if not port_text:
        return host, None
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5 or int(port_text) > 65535:
        return None
    return host, int(port_text)


def is_ip_literal(host: str) -> bool:
    """Whether `host` (as `split_host` gives it) is an IPv4 or IPv6 address written out: `127.0.0.1`,
    `::1`; not `0x7f.1` or `127.1` (inet_aton's shorthands, which no browser puts in a Host header: it
    writes the dotted quad)."""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def origin_parts(origin: str) -> tuple[str, str, int] | None:
    """(scheme, hostname, port) of an `Origin` value, the port filled in for http(s); None when it is
    not `scheme://host[:port]` (a path other than `/` included)."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if not scheme or not parts.netloc or parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    if parts.username is not None or parts.password is not None:
        return None
    hostname = parts.hostname or ""
    host = _ipv6(hostname) if ":" in hostname else _name(hostname)
    if host is None:
        return None
    if port is None:
        port = _DEFAULT_PORTS.get(scheme)
        if port is None:
            return None
    return scheme, host, port


def machine_names() -> set[str]:
    """This machine's own names: `gethostname()`, `getfqdn()` and their first labels."""
    out: set[str] = set()
    for get in (socket.gethostname, socket.getfqdn):
        try:
            name = _name(get())
        except OSError:
            continue
        if name:
            out |= {name, name.split(".", 1)[0]}
    return out


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: its HTTP status, message and error type."""

    status: int
    message: str
    type: str

    def body(self) -> dict[str, dict[str, int | str]]:
        return {"error": {"code": self.status, "message": self.message, "type": self.type}}


class RequestGuard:
    """The guard of one server: its CORS policy and the names it listens on (`--host`, comma-separated
    addresses allowed; a path ending in `.sock` is a Unix socket)."""

    def __init__(
        self,
        cors: CorsPolicy,
        host: str = "127.0.0.1",
        names: Callable[[], Iterable[str]] = machine_names,
    ) -> None:
        self.cors = cors
        binds = [h.strip() for h in host.split(",")]
        self.unix = any(h.endswith(".sock") or h.startswith("/") for h in binds)
        self.names = {"localhost"}
        remote = False
        for h in binds:
            bare = h.removeprefix("[").removesuffix("]")
            if bare in _WILDCARDS:
                remote = True
            elif is_ip_literal(bare):
                remote |= not ipaddress.ip_address(bare.split("%", 1)[0]).is_loopback
            elif (name := _name(bare)) is not None:
                self.names.add(name)
                remote |= name != "localhost"
        if remote:  # reachable from other machines, under the machine's own names too
            self.names |= set(names())

    def check(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> Refusal | None:
        """None when the request may go on, else the refusal to answer with. `headers` are the raw ASGI
        (name, value) pairs; nothing of the body is read."""
        kind = guard_kind(method, path)
        if kind is None:
            return None
        hosts: list[str] = []
        origins: list[str] = []
        types: list[str] = []
        length = transfer = None
        for k, v in headers:
            name = k.lower()
            if name == b"host":
                hosts.append(v.decode("latin-1"))
            elif name == b"origin":
                origins.append(v.decode("latin-1"))
            elif name == b"content-type":
                types.append(v.decode("latin-1"))
            elif name == b"content-length":
                length = v.strip()
            elif name == b"transfer-encoding":
                transfer = v
        refusal, host = self._host(hosts)
        if refusal is None:
            refusal = self._origin(origins, host)
        if refusal is None and kind == GUARD_FULL:
            empty = transfer is None and length in (None, b"0")
            refusal = _content_type(types, empty)
        return refusal

    def _host(self, values: list[str]) -> tuple[Refusal | None, tuple[str, int | None] | None]:
        if not values:
            return None, None
        parsed = split_host(values[0]) if len(values) == 1 else None
        if parsed is None:
            return _forbidden(f"invalid Host header: {values[0][:200]!r}"), None
        if not parsed[0]:
            return None, None
        if self.unix or is_ip_literal(parsed[0]) or parsed[0] in self.names:
            return None, parsed
        return _forbidden(
            f"host '{parsed[0]}' is not a name this server listens on (DNS rebinding guard): use its "
            "IP address, localhost or the --host name"
        ), None

    def _origin(self, values: list[str], host: tuple[str, int | None] | None) -> Refusal | None:
        for origin in values:
            if origin.strip().lower() == "null":
                return _forbidden("origin 'null' is not allowed")
            if not (self.cors.allows(origin) or _same_origin(origin, host)):
                return _forbidden(f"origin '{origin[:200]}' is not allowed (--cors-origins)")
        return None


def _same_origin(origin: str, host: tuple[str, int | None] | None) -> bool:
    """Whether `origin` is the page of this server: its host and port are the Host header's (the port the
    scheme's default when the Host header gives none)."""
    parts = origin_parts(origin)
    if parts is None or host is None or not host[0]:
        return False
    scheme, name, port = parts
    return name == host[0] and port == (host[1] if host[1] is not None else _DEFAULT_PORTS.get(scheme))


def _content_type(values: list[str], empty: bool) -> Refusal | None:
    if not values and empty:
        return None
    media = [v.split(";", 1)[0].strip().lower() for v in values]
    if media and all(m == "application/json" for m in media):
        return None
    given = (
        f"unsupported Content-Type '{values[0][:100]}'" if values else "a request body without Content-Type"
    )
    return Refusal(
        415, f"{given}: this endpoint expects Content-Type: application/json", "invalid_request_error"
    )


def _forbidden(message: str) -> Refusal:
    return Refusal(403, message, "permission_error")
