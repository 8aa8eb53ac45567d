"""Child mode: a `llama-server` started by `llama-router` (env `LLAMA_SERVER_ROUTER_PORT` set).

Its stdout carries only `cmd_child_to_router:state:<json>` lines (anything else printed goes to stderr);
the line `cmd_router_to_child:exit` on stdin asks for the normal shutdown, and EOF on stdin (the router
died) ends the process at once with status 1.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

__all__ = ["ChildChannel", "current_channel", "is_child"]

CMD_PREFIX = "cmd_child_to_router:state:"
EXIT_COMMAND = "cmd_router_to_child:exit"


_current: ChildChannel | None = None


def current_channel() -> ChildChannel | None:
    """The channel to the router of this child process (None when not a child)."""
    return _current


def is_child() -> bool:
    return bool(os.environ.get("LLAMA_SERVER_ROUTER_PORT"))


class ChildChannel:
    """The command pipes to the router, for one server state."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self._lock = threading.Lock()
        sys.stdout.flush()
        # keep the real stdout for commands; fd 1 (and so every other print) now goes to stderr
        self._out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        os.dup2(2, 1)

    def send(self, state: str, payload: dict[str, Any]) -> None:
        line = CMD_PREFIX + json.dumps({"state": state, "payload": payload}, separators=(",", ":"))
        with self._lock:
            self._out.write(line + "\n")
            self._out.flush()

    def start(self) -> ChildChannel:
        global _current
        _current = self
        self.send("loading", {"stages": ["text_model"], "current": "text_model", "value": 0.0})
        threading.Thread(target=self._read_stdin, name="llama-server-router-in", daemon=True).start()
        threading.Thread(target=self._report_ready, name="llama-server-router-out", daemon=True).start()
        return self

    def _read_stdin(self) -> None:
        for line in sys.stdin.buffer:
            if EXIT_COMMAND.encode() in line:
                os.kill(os.getpid(), signal.SIGTERM)  # the normal drained shutdown, exit status 0
                return
        os._exit(1)  # EOF: the router is gone

    def _report_ready(self) -> None:
        st = self.state
        while not st.ready.wait(0.2):
            if st.load_error:
                return
        self.send("loading", {"stages": ["text_model"], "current": "text_model", "value": 1.0})
        self.send("ready", model_info(st))


def model_info(st: Any) -> dict[str, Any]:
    """What the server's `/v1/models` reports in `data[0]`."""
    meta: dict[str, Any] = {}
    try:
        meta = st.model_meta()
    except Exception:  # reported without meta rather than not at all
        meta = {}
    return {
        "id": st.model_name,
        "aliases": sorted(st.config.alias),
        "tags": sorted(st.config.tags),
        "object": "model",
        "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
        "created": int(st.started or time.time()),
        "owned_by": "llamacpp",
        "meta": meta,
    }


def run_router() -> None:
    """Router mode (`--models-dir`/`--models-preset` and no model): replace this process with the
    installed `llama-router`, given the same arguments. Children are started with this `llama-server`."""
    import shutil

    import click

    beside = os.path.join(os.path.dirname(sys.executable), "llama-router")
    router = beside if os.path.isfile(beside) else shutil.which("llama-router")
    if router is None:
        raise click.UsageError("router mode needs llama-router: pip install llama-router")
    server = os.path.abspath(sys.argv[0]) if os.path.isfile(sys.argv[0]) else "llama-server"
    env = {**os.environ, "LLAMA_SERVER_BIN": server}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(router, [router, *sys.argv[1:]], env)
