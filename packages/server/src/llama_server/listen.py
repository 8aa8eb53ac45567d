"""`--host a,b,c`: llama-server listens on every comma-separated address (one port for all)."""

from __future__ import annotations

import socket

__all__ = ["bind_all", "host_list"]


def host_list(value: str) -> list[str]:
    """The addresses of `--host` (brackets around IPv6 addresses are allowed)."""
    return [h.strip().removeprefix("[").removesuffix("]") for h in value.split(",") if h.strip()]


def bind_all(hosts: list[str], port: int) -> list[socket.socket]:
    """A listening socket on each address; with port 0 the first one picks it and the others share it."""
    out: list[socket.socket] = []
    try:
        for host in hosts:
            sock = _tcp_listener(host, port)
            out.append(sock)
            port = sock.getsockname()[1]
    except OSError:
        for s in out:
            s.close()
        raise
    return out


def _tcp_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket made with IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets whose proto
    says TCP (`socket.create_server` leaves it 0), and without it every small response on a kept-alive
    connection waits ~40 ms for the peer's delayed ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock
