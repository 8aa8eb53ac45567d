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
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.create_server((host, port), family=family, reuse_port=False)
            out.append(sock)
            port = sock.getsockname()[1]
    except OSError:
        for s in out:
            s.close()
        raise
    return out
