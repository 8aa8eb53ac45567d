"""llama-router's relay cost without a model: the router's own CPU time per streamed event and the first
byte's extra latency, against a loopback upstream that streams SSE events as a child does (one chunk per
event, `--gap` seconds apart). The router reaches it as a remote replica (`remote = URL` in a preset).

CPU time (from /proc) is what the relay takes from an engine sharing the cores, and it depends far less
on the machine's load than wall times do; the figures are medians over `--repeats` runs.

    python packages/router/bench/bench_relay.py [--events 1500] [--gap 0.0005] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

EVENT = (
    b'data: {"index":0,"content":" word","tokens":[],"stop":false,"id_slot":0,"tokens_predicted":1,'
    b'"tokens_evaluated":6}\n\n'
)


def _upstream(events: int, gap: float) -> int:
    """A tiny llama-server stand-in on a thread of its own: `/health`, and an SSE stream for anything else."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                n = next(
                    (
                        int(v)
                        for k, _, v in (x.partition(":") for x in lines)
                        if k.lower() == "content-length"
                    ),
                    0,
                )
                await reader.readexactly(n)
                if lines[0].split(" ")[1].startswith("/health"):
                    writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 15\r\n\r\n{"status":"ok"}')
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                for _ in range(events):
                    writer.write(b"%x\r\n%s\r\n" % (len(EVENT), EVENT))
                    await writer.drain()
                    await asyncio.sleep(gap)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return int(server.sockets[0].getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    """CPU seconds of every thread of `pid` (schedstat: nanoseconds, where stat counts clock ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def _stream(client: httpx.Client, url: str) -> tuple[float, int]:
    """(seconds to the first byte, events received) of one streamed request."""
    t0 = time.perf_counter()
    first, events = 0.0, 0
    with client.stream(
        "POST", url + "/completion", json={"model": "relay", "prompt": "x", "stream": True}
    ) as r:
        for chunk in r.iter_raw():
            first = first or time.perf_counter() - t0
            events += chunk.count(b"data: ")
    return first, events


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1500)
    ap.add_argument(
        "--gap", type=float, default=0.0005, help="seconds between events (0.0005 = one per chunk)"
    )
    ap.add_argument("--repeats", type=int, default=5)
    args, _ = ap.parse_known_args()  # the bench session passes every script the same arguments
    up = f"http://127.0.0.1:{_upstream(args.events, args.gap)}"
    with tempfile.TemporaryDirectory() as d:
        preset = Path(d) / "relay.ini"
        preset.write_text(f"[relay]\nremote = {up}\n")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "llama_router",
            "--models-preset",
            str(preset),
            "--port",
            str(port),
            "--log-disable",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        router = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(timeout=120) as c:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    try:
                        if c.get(router + "/health").status_code == 200:
                            break
                    except httpx.TransportError:
                        time.sleep(0.1)
                _stream(c, router), _stream(c, up)  # warm both paths
                cpu, first_via, first_direct = [], [], []
                for _ in range(args.repeats):  # interleaved: a change in the machine's load hits both
                    c0 = _cpu_seconds(proc.pid)
                    first, events = _stream(c, router)
                    cpu.append((_cpu_seconds(proc.pid) - c0) / max(events, 1) * 1e6)
                    first_via.append(first)
                    first_direct.append(_stream(c, up)[0])
        finally:
            proc.terminate()
            proc.wait(30)
    print(
        f"\n## llama-router relay, {args.events} events {args.gap * 1e3:.1f} ms apart, median of {args.repeats}\n"
    )
    print("| router CPU per event | first byte via router | first byte direct |")
    print("|---:|---:|---:|")
    print(
        f"| {_median(cpu):.0f} us | {_median(first_via) * 1e3:.2f} ms | {_median(first_direct) * 1e3:.2f} ms |"
    )


if __name__ == "__main__":
    main()
