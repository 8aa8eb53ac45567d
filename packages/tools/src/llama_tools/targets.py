"""Which addresses `/cors-proxy` may connect to (a fetch on a caller's behalf must not reach the host's own
network): public unicast only, plus what `--cors-proxy-allow` names.

Decisions are taken on addresses, never on how a URL spells them: a host is an IP literal in any spelling
a resolver accepts (`2130706433`, `0x7f000001`, `0177.0.0.1`, `127.1`, `[::ffff:127.0.0.1]`, a zone id),
or a name resolved once; every address it resolves to is checked and the connection goes to one of the
checked addresses, so a second answer from DNS (rebinding) never comes into play.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import unquote

import httpx

__all__ = [
    "REFUSED_MESSAGE",
    "AllowEntry",
    "IPAddress",
    "Resolver",
    "TargetPolicy",
    "TargetRefused",
    "classify",
    "parse_allow_list",
    "parse_ip",
    "system_resolver",
]

log = logging.getLogger("llama_tools")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# (host, port) -> the addresses the host resolves to, as strings (an IPv6 one may carry `%zone`)
Resolver = Callable[[str, int], Awaitable[list[str]]]

# the address is not named: a caller may not learn what the server's resolver says about internal names
REFUSED_MESSAGE = (
    "the target address is not allowed: loopback, private, link-local and other non-public addresses "
    "are refused unless listed in --cors-proxy-allow"
)

# IANA's special-purpose registries; anything else in IPv4 is public
_V4_SPECIAL = tuple(
    (ipaddress.IPv4Network(net), why)
    for net, why in (
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared (CGNAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved"),  # IETF protocol assignments
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "reserved"),  # the deprecated 6to4 relay anycast
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),  # 255.255.255.255, the limited broadcast, included
    )
)
# checked before the embedded IPv4 address and before "outside 2000::/3"
_V6_SPECIAL = tuple(
    (ipaddress.IPv6Network(net), why)
    for net, why in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "private"),  # local-use NAT64
        ("2001:2::/48", "benchmarking"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("fc00::/7", "unique-local"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    )
)
_V6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_V6_IETF = ipaddress.IPv6Network("2001::/23")  # protocol assignments: not global, Teredo aside
_TEREDO = ipaddress.IPv6Network("2001::/32")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
_V4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated IPv4-compatible addresses

_DIGITS = {8: "01234567", 10: "0123456789", 16: "0123456789abcdefABCDEF"}
_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*$"
)


class TargetRefused(Exception):
    """A target whose address the proxy may not reach (HTTP 403); the message does not name the address."""

    def __init__(self) -> None:
        super().__init__(REFUSED_MESSAGE)


def _ipv4_part(text: str) -> int | None:
    """One part of an inet_aton IPv4 literal: decimal, `0x` hexadecimal or `0` octal."""
    if text[:2] in ("0x", "0X"):
        digits, base = text[2:], 16
    elif len(text) > 1 and text[0] == "0":
        digits, base = text[1:], 8
    else:
        digits, base = text, 10
    if not digits or any(c not in _DIGITS[base] for c in digits):
        return None
    return int(digits, base)


def _ipv4_literal(host: str) -> ipaddress.IPv4Address | None:
    """inet_aton's (and the URL standard's) reading: 1-4 parts, the last filling the remaining bytes."""
    parts = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = [_ipv4_part(p) for p in parts]
    if any(v is None for v in values):
        return None
    *head, last = values
    assert last is not None
    if any(v > 255 for v in head) or last >= 256 ** (5 - len(parts)):  # type: ignore[operator]
        return None
    value = last
    for i, v in enumerate(head):
        value += v << (24 - 8 * i)  # type: ignore[operator]
    return ipaddress.IPv4Address(value)


def parse_ip(host: str) -> IPAddress | None:
    """The address an IP literal host means (brackets and a `%zone` allowed), or None for a name."""
    h = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in h:
        address, _, zone = unquote(h).partition("%")  # a URL writes the zone's `%` as `%25`
        try:
            return ipaddress.IPv6Address(f"{address}%{zone}" if zone else address)
        except ValueError:
            return None
    return _ipv4_literal(h)


def _unscoped(ip: IPAddress) -> IPAddress:
    return ipaddress.IPv6Address(int(ip)) if ip.version == 6 else ip


def _embedded_v4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries: mapped, compatible, NAT64, 6to4, Teredo."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip in _V4_COMPATIBLE or ip in _NAT64:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    return []


def classify(ip: IPAddress) -> str | None:
    """Why the proxy may not reach `ip` ("loopback", "private", ...), or None for a public address."""
    if isinstance(ip, ipaddress.IPv4Address):
        return next((why for net, why in _V4_SPECIAL if ip in net), None)
    ip = ipaddress.IPv6Address(int(ip))  # the zone does not change what the address is
    why = next((why for net, why in _V6_SPECIAL if ip in net), None)
    if why is not None:
        return why
    embedded = _embedded_v4(ip)
    if embedded:
        return next((w for w in map(classify, embedded) if w is not None), None)
    if ip not in _V6_GLOBAL_UNICAST or ip in _V6_IETF:
        return "reserved"
    return None


@dataclass(frozen=True, slots=True)
class AllowEntry:
    """One `--cors-proxy-allow` entry: a host name as written, or an address network; any port if None."""

    name: str = ""
    network: IPNetwork | None = None
    port: int | None = None

    def permits(self, host: str, port: int, ip: IPAddress) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.network is None:
            return _normal_name(host) == self.name
        plain = _unscoped(ip)
        # an allowed IPv4 network also allows the same addresses written as IPv4-mapped IPv6 and the like
        candidates = [plain, *_embedded_v4(plain)] if isinstance(plain, ipaddress.IPv6Address) else [plain]
        return any(a.version == self.network.version and a in self.network for a in candidates)


def _normal_name(host: str) -> str:
    return host.lower().rstrip(".")


def _split_port(entry: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `[v6]`, `[v6]:port`, `[v6/len]:port`; a bare IPv6 address has no port."""
    if entry.startswith("["):
        end = entry.find("]")
        if end < 0:
            raise ValueError("unbalanced [")
        host, rest = entry[1:end], entry[end + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError("expected :port after ]")
        return host, _port(rest[1:])
    if entry.count(":") == 1:
        host, port = entry.split(":")
        return host, _port(port)
    return entry, None


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"invalid port {text!r}")
    return int(text)


def _entry(text: str) -> AllowEntry:
    host, port = _split_port(text)
    if "/" in host:
        return AllowEntry(network=ipaddress.ip_network(host.split("%", 1)[0], strict=False), port=port)
    ip = parse_ip(host)
    if ip is not None:
        return AllowEntry(network=ipaddress.ip_network(_unscoped(ip)), port=port)
    try:  # the name as httpx will hand it to the connection (lower case, IDNA-encoded)
        name = _normal_name(httpx.URL(f"http://{host}/").raw_host.decode("ascii"))
    except (httpx.InvalidURL, UnicodeError):
        name = ""
    if not _NAME.match(name):
        raise ValueError("not a host name, IP address or CIDR network")
    return AllowEntry(name=name, port=port)


def parse_allow_list(value: str | tuple[str, ...] | list[str] | None) -> tuple[AllowEntry, ...]:
    """`--cors-proxy-allow` entries (comma-separated in a string); raises ValueError naming a bad entry."""
    if not value:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for raw in items:
        text = raw.strip()
        if not text:
            continue
        try:
            out.append(_entry(text))
        except ValueError as e:
            raise ValueError(f"--cors-proxy-allow: invalid entry {text!r}: {e}") from None
    return tuple(out)


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses of `host` from the system resolver, in its order, without blocking the event loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[str] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = str(sockaddr[0])
        if len(sockaddr) == 4 and sockaddr[3] and "%" not in address:  # a link-local one needs its scope
            address = f"{address}%{sockaddr[3]}"
        if address not in out:
            out.append(address)
    return out


class TargetPolicy:
    """Resolve a target host once and check every address it has against the allow list."""

    def __init__(self, allow: tuple[AllowEntry, ...] = (), resolver: Resolver = system_resolver) -> None:
        self.allow = allow
        self.resolver = resolver

    def check(self, host: str, port: int, ip: IPAddress) -> None:
        """Raises TargetRefused unless `ip` is public or allowed for `host:port`."""
        why = classify(ip)
        if why is None or any(e.permits(host, port, ip) for e in self.allow):
            return
        log.warning("cors-proxy: refused %s:%d (%s, %s address)", host, port, ip, why)
        raise TargetRefused()

    def check_literal(self, host: str, port: int) -> None:
        """The check an IP literal host gets before any request is built (a name waits for `addresses`)."""
        ip = parse_ip(host)
        if ip is not None:
            self.check(host, port, ip)

    async def addresses(self, host: str, port: int) -> list[str]:
        """The checked addresses to connect to, in the resolver's order; refused if any one is not allowed,
        so a name that mixes public and private answers is refused whichever would be tried first."""
        literal = parse_ip(host)
        found = [str(literal)] if literal is not None else await self.resolver(host, port)
        if not found:
            raise OSError(f"no address for {host}")
        for address in found:
            self.check(host, port, ipaddress.ip_address(address))
        return found
