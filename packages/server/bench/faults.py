"""Bad input against a busy server: does any request stall the others?

Starts our llama-server (4 slots, SmolLM2, embeddings on), keeps 4 live streams going (a monitor process
that also polls `/health` every 20 ms), and fires one fault after another: a `/completion` with 64 prompts
of 160,000 characters, `/tokenize` with a list `content` of 3 MB, 4,096 text keys in `logit_bias`, a client
that stops reading a stream with `n_probs` 1024, a long embedding input, a large legal tokenization, and
last SIGTERM with the 4 streams in flight. For each fault: its status code, how long it took, the worst gap
between two tokens of any live stream and the worst `/health` latency while it ran; then the worst of all
against the targets (under 250 ms and 100 ms). Loopback only; every loop is bounded; it stops by itself.

    python packages/server/bench/faults.py [-m model.gguf]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from _servers import Server, free_port, ours_command, serve, smollm2, stream_completion

GAP_TARGET = 0.250  # seconds between two tokens of a live stream
HEALTH_TARGET = 0.100  # seconds for GET /health
N_LIVE = 4
SETTLE = 0.5  # seconds after a fault's answer that still count towards it (a stall shows up late)
# short enough that the slots turn over: a fault that needs a slot waits for one, not for a whole story
LIVE_BODY = {"prompt": "Once upon a time", "n_predict": 128, "temperature": 0, "ignore_eos": True}
BASELINE = "baseline (no fault)"
FAULT_TIMEOUT = 60.0  # seconds; a fault that takes longer is reported as its exception
PROSE = (
    "The river bends past the old mill, where the water runs fast and cold over smooth stones. "
    "Children count the boats, and the miller's dog barks at every one of them. "
)


@dataclass
class Fault:
    name: str
    status: int | str
    seconds: float
    t0: float
    t1: float
    note: str = ""


# -- the monitor: live streams and /health, in its own process so the faults' big bodies never hold its GIL --


def monitor(base: str) -> None:
    """Until a line arrives on stdin (or 10 minutes pass): 4 streams back to back and /health every 20 ms;
    then print what was seen as one JSON line."""
    stop = threading.Event()
    streams: list[list[dict]] = [[] for _ in range(N_LIVE)]
    health: list[tuple[float, float, int]] = []

    def live(i: int) -> None:
        with httpx.Client(base_url=base, timeout=60) as client:
            while not stop.is_set():
                s = stream_completion(client, LIVE_BODY, stop)
                streams[i].append(
                    {
                        "started": s.started,
                        "ended": s.ended,
                        "ending": s.ending,
                        "status": s.status,
                        "gaps": s.gaps(),
                        "n": len(s.token_times),
                    }
                )
                if not s.token_times:
                    stop.wait(0.1)  # the server is gone or refusing: do not spin

    def poll() -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            while not stop.is_set():
                t = time.monotonic()
                try:
                    status = client.get("/health").status_code
                except httpx.TransportError:
                    status = 0
                took = time.monotonic() - t
                health.append((t, took, status))
                stop.wait(max(0.0, 0.02 - took))

    threads = [threading.Thread(target=live, args=(i,)) for i in range(N_LIVE)]
    threads.append(threading.Thread(target=poll))
    for t in threads:
        t.start()
    print("ready", flush=True)
    watchdog = threading.Timer(600, stop.set)
    watchdog.start()
    sys.stdin.readline()
    stop.set()
    watchdog.cancel()
    for t in threads:
        t.join(timeout=70)
    print(json.dumps({"streams": streams, "health": health}), flush=True)


# -- the faults -------------------------------------------------------------------------------------------------


def _post(base: str, path: str, body: dict, timeout: float = FAULT_TIMEOUT) -> int:
    data = json.dumps(body).encode()  # encoded before the clock starts
    with httpx.Client(base_url=base, timeout=timeout) as client:
        return client.post(path, content=data, headers={"Content-Type": "application/json"}).status_code


def _text(n_chars: int) -> str:
    return (PROSE * (n_chars // len(PROSE) + 1))[:n_chars]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _stalled_reader(server: Server, hold: float = 10.0) -> tuple[int | str, str]:
    """A streamed completion with n_probs 1024 whose client reads nothing for ``hold`` seconds (a small
    receive buffer, so the server's side fills up), then its status line, then it hangs up."""
    body = json.dumps(
        {
            "prompt": "Once upon a time",
            "n_predict": 4096,
            "n_probs": 1024,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0,
        }
    ).encode()
    host, port = server.base.removeprefix("http://").split(":")
    before = peak = _rss_mib(server.proc.pid)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        head = f"POST /completion HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + hold
        while time.monotonic() < deadline:
            peak = max(peak, _rss_mib(server.proc.pid))
            time.sleep(0.25)
        sock.settimeout(5)
        first = sock.recv(64).split(b"\r\n", 1)[0].decode(errors="replace")
    status: int | str = int(first.split()[1]) if first.startswith("HTTP/") else first or "no answer"
    return status, f"server RSS {before:.0f} -> peak {peak:.0f} MiB while not reading"


def _cases(server: Server) -> list[tuple[str, Callable[[], tuple[int | str, str]]]]:
    base = server.base

    def plain(path: str, body: dict) -> Callable[[], tuple[int | str, str]]:
        return lambda: (_post(base, path, body), "")

    bias = {f" word{i}": -0.5 for i in range(4096)}
    return [
        (
            "/completion, 64 prompts of 160,000 chars",
            plain("/completion", {"prompt": [_text(160_000)] * 64, "n_predict": 4}),
        ),
        ("/tokenize, list content of 3 MB", plain("/tokenize", {"content": [_text(1000)] * 3000})),
        (
            "logit_bias with 4,096 text keys",
            plain("/completion", {"prompt": "Hi", "n_predict": 4, "logit_bias": bias}),
        ),
        ("stalled reader, n_probs 1024", lambda: _stalled_reader(server)),
        # ~1,850 tokens: one batch (2,048) is the most one embedding input may hold, as in llama.cpp
        ("long embedding input (8,000 chars)", plain("/embedding", {"content": _text(8_000)})),
        ("/tokenize, 1,000,000 chars (legal)", plain("/tokenize", {"content": _text(1_000_000)})),
    ]


def _worst(spans: list[tuple[float, float]], t0: float, t1: float) -> float:
    """The longest (end time, duration) span that overlaps [t0, t1]: a stall that began during a fault counts
    towards it even when it ends after."""
    return max((d for end, d in spans if end > t0 and end - d < t1), default=0.0)


def _sigterm(server: Server) -> Fault:
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        code: int | str = server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        code = "still running after 30 s"
    t1 = time.monotonic()
    return Fault("SIGTERM, 4 streams in flight", f"exit {code}", t1 - t0, t0, t1)


def _window(f: Fault, gaps: list, health: list, tokens: list[float]) -> tuple[float, float, float]:
    """The worst token gap, the worst /health latency and the live streams' tokens/s while ``f`` ran."""
    t0, t1 = f.t0, f.t1 + SETTLE
    n = sum(1 for t in tokens if t0 <= t <= t1)
    return _worst(gaps, t0, t1), _worst(health, t0, t1), n / (t1 - t0)


def _report(faults: list[Fault], seen: dict, sigterm: Fault) -> None:
    runs = [run for per_stream in seen["streams"] for run in per_stream]
    gaps = [(t, g) for run in runs for t, g in run["gaps"]]
    tokens = [t for t, _ in gaps]
    health = [(t + took, took) for t, took, status in seen["health"] if status]
    print(
        f"| {'fault':<40} | {'status':>8} | {'s':>6} | {'worst gap ms':>12} | {'worst /health ms':>16} "
        f"| {'live tok/s':>10} | note"
    )
    print(f"|{'-' * 42}|{'-' * 10}|{'-' * 8}|{'-' * 14}|{'-' * 18}|{'-' * 12}|------")
    worst_gap = worst_health = 0.0
    for f in faults:
        g, h, tps = _window(f, gaps, health, tokens)
        if f.name != BASELINE:
            worst_gap, worst_health = max(worst_gap, g), max(worst_health, h)
        print(
            f"| {f.name:<40} | {f.status!s:>8} | {f.seconds:6.2f} | {g * 1e3:12.0f} | {h * 1e3:16.0f} "
            f"| {tps:10.1f} | {f.note}"
        )
    in_flight = [run for run in runs if run["started"] < sigterm.t0 < run["ended"]]
    finals = sum(run["ending"] == "final" for run in in_flight)
    print(
        f"| {sigterm.name:<40} | {sigterm.status!s:>8} | {sigterm.seconds:6.2f} | {'':>12} | {'':>16} "
        f"| {'':>10} | {finals} of {len(in_flight)} streams in flight ended with a final event"
    )
    ok = worst_gap < GAP_TARGET and worst_health < HEALTH_TARGET
    print(
        f"\nworst inter-token gap of the {N_LIVE} live streams during the faults: {worst_gap * 1e3:.0f} ms "
        f"(target < {GAP_TARGET * 1e3:.0f}); worst /health latency: {worst_health * 1e3:.0f} ms "
        f"(target < {HEALTH_TARGET * 1e3:.0f}): {'met' if ok else 'NOT met'}"
    )


def _server_errors(log: Path) -> None:
    """The server's own account of anything that went wrong (tracebacks, errors), then its log goes."""
    lines = log.read_text(errors="replace").splitlines()
    bad = [i for i, line in enumerate(lines) if "Traceback" in line or "ERROR" in line]
    if bad:
        print(f"\nthe server logged {len(bad)} errors; the first:")
        print("\n".join(lines[bad[0] : bad[0] + 30]))
    shutil.rmtree(log.parent)


def _fire(server: Server) -> list[Fault]:
    faults = []
    t0 = time.monotonic()
    time.sleep(2.0)
    faults.append(Fault(BASELINE, "-", 2.0, t0, time.monotonic() - SETTLE))
    for name, case in _cases(server):
        t0 = time.monotonic()
        try:
            status, note = case()
        except (httpx.HTTPError, OSError) as e:
            status, note = type(e).__name__, str(e)[:80]
        t1 = time.monotonic()
        faults.append(Fault(name, status, t1 - t0, t0, t1, note))
        time.sleep(SETTLE)
    return faults


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--monitor", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.monitor:
        monitor(args.monitor)
        return
    model = args.model or smollm2()
    cmd = ours_command(model, free_port(), "-c", "8192", "-np", str(N_LIVE), "--embeddings", quiet=False)
    log = Path(tempfile.mkdtemp(prefix="faults-")) / "server.log"
    print(
        f"\n## faults against llama-server (ours), {Path(model).name}, {N_LIVE} slots, {N_LIVE} live streams\n"
    )
    with serve(cmd, log=log) as server:
        server.wait_health()
        _post(server.base, "/completion", {"prompt": "Hi", "n_predict": 4})  # warm: nothing compiles later
        _post(server.base, "/embedding", {"content": "Hi"})
        mon = subprocess.Popen(
            [sys.executable, __file__, "--monitor", server.base],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert mon.stdin is not None and mon.stdout is not None
        try:
            mon.stdout.readline()  # "ready"
            time.sleep(1.0)  # the streams are past their first token
            faults = _fire(server)
            sigterm = _sigterm(server)
            time.sleep(SETTLE)
            mon.stdin.write("stop\n")
            mon.stdin.flush()
            seen = json.loads(mon.stdout.readline())
        finally:
            if mon.poll() is None:
                mon.kill()
            mon.wait()
    _report(faults, seen, sigterm)
    _server_errors(log)


if __name__ == "__main__":
    main()
