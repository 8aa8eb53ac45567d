"""The Ray actor behind one replica: it runs a `llama-server` child on its node and says where it listens.

This module is imported on the cluster's nodes (they need llama-router and llama-server installed, as the
router's machine has). It imports Ray only inside the actor: the router turns the class into an actor
(`ray.remote(ReplicaActor)`) when `--ray` is given.

The child dies with the actor's worker (Linux `PR_SET_PDEATHSIG`), so a killed actor or node leaves no
server behind. A child that exits on its own is reported (`info()["state"] == "exited"`, with the last lines
of its log); the router then replaces the actor.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["ReplicaActor", "free_port", "node_ip"]

LOG_TAIL = 40  # lines of the child's log kept for the router's error messages


def node_ip() -> str:
    """The address other nodes reach this one by (Ray's own choice for the node)."""
    import ray

    return str(ray.util.get_node_ip_address())


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _server_command(command: list[str]) -> list[str]:
    """The router's llama-server command, or this node's own when that path does not exist here."""
    if command and os.path.isfile(command[0]):
        return command
    beside = os.path.join(os.path.dirname(sys.executable), "llama-server")
    if os.path.isfile(beside):
        return [beside, *command[1:]]
    found = shutil.which("llama-server")
    if found is None:
        raise RuntimeError("llama-server is not installed on this node (pip install llama-server)")
    return [found, *command[1:]]


class ReplicaActor:
    """One replica: `info()` answers at once (loading, loaded, exited); `stop()` ends the child."""

    def __init__(self, model: str, command: list[str], args: list[str], env: dict[str, str]) -> None:
        import ray

        self.model = model
        self.host = node_ip()
        self.port = free_port(self.host)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.log: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        self.state = "loading"
        self.started = time.time()
        self.stopping = False
        full = [
            *_server_command(command), *args,
            "--host", self.host, "--port", str(self.port), "--alias", model,
        ]  # fmt: skip
        child_env = {**os.environ, **env}
        self.proc = subprocess.Popen(
            full,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.key = env.get("LLAMA_API_KEY", "")
        threading.Thread(target=self._read_log, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))

    def _watch(self) -> None:
        """Loaded when `/health` answers 200; exited when the child ends."""
        url = f"http://{self.host}:{self.port}/health"
        while self.proc.poll() is None and self.state == "loading":
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        self.state = "loaded"
                        break
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        self.proc.wait()
        self.state = "exited"

    def info(self) -> dict[str, Any]:
        return {
            "url": f"http://{self.host}:{self.port}",
            "key": self.key,  # a restarted router reattaching needs it (whoever can call the actor can run code)
            "node_id": self.node_id,
            "node_ip": self.host,
            "pid": os.getpid(),
            "child_pid": self.proc.pid,
            "state": self.state,
            "exit_code": self.proc.returncode,
            "log": list(self.log) if self.state == "exited" else [],
            "started": self.started,
        }

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (the child's graceful shutdown), SIGKILL after `timeout` seconds."""
        self.stopping = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
