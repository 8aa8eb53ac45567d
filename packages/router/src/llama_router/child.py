"""One child process and its two pipes (router.md §7): state lines on stdout, logs on stderr, the exit
command on stdin, force-kill after the stop timeout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["CMD_PREFIX", "EXIT_COMMAND", "ChildProcess"]

log = logging.getLogger("llama_router")

CMD_PREFIX = "cmd_child_to_router:"
EXIT_COMMAND = b"cmd_router_to_child:exit\n"
LINE_LIMIT = 1 << 20  # a longer line without newline is discarded


class ChildProcess:
    """A started child. `on_state(state, payload)` is called for each state line, `on_exit(code)` once."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        tag: str,
        on_state: Callable[[str, dict[str, Any]], None],
        on_exit: Callable[[int], None],
    ) -> None:
        self.args = args
        self.env = env
        self.tag = tag
        self.on_state = on_state
        self.on_exit = on_exit
        self.proc: asyncio.subprocess.Process | None = None
        self.exited = asyncio.Event()
        self.returncode: int | None = None
        self.asked = False  # the router asked it to stop: a non-zero exit is then no crash
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            limit=LINE_LIMIT,
            start_new_session=True,  # a Ctrl-C at the router's terminal is the router's to handle
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._tasks = [
            asyncio.create_task(self._read(self.proc.stdout, self._command)),
            asyncio.create_task(self._read(self.proc.stderr, self._log)),
            asyncio.create_task(self._wait()),
        ]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def _read(self, stream: asyncio.StreamReader, handle: Callable[[str], None]) -> None:
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # longer than LINE_LIMIT without a newline: dropped
                log.warning("[%s] discarded an over-long output line", self.tag)
                continue
            if not line:
                return
            handle(line.decode("utf-8", "replace").rstrip("\r\n"))

    def _log(self, line: str) -> None:
        log.info("[%s] %s", self.tag, line)

    def _command(self, line: str) -> None:
        if not line.startswith(CMD_PREFIX):
            log.warning("[%s] unexpected output on stdout: %s", self.tag, line[:500])
            return
        kind, _, rest = line[len(CMD_PREFIX) :].partition(":")
        try:
            msg = json.loads(rest) if kind == "state" else None
            if not isinstance(msg, dict) or not isinstance(msg.get("state"), str):
                raise ValueError("not a state object")
            payload = msg.get("payload")
            self.on_state(msg["state"], payload if isinstance(payload, dict) else {})
        except Exception as e:
            log.warning("[%s] malformed child command ignored (%s): %s", self.tag, e, line[:500])

    async def _wait(self) -> None:
        assert self.proc is not None
        code = await self.proc.wait()
        await asyncio.gather(*self._tasks[:2], return_exceptions=True)  # drain the last lines first
        self.returncode = code
        self.exited.set()
        self.on_exit(code)

    def send_exit(self) -> None:
        """Ask for a graceful exit (the child runs its normal shutdown)."""
        if self.proc and self.proc.stdin and not self.proc.stdin.is_closing():
            with contextlib.suppress(Exception):
                self.proc.stdin.write(EXIT_COMMAND)

    def kill(self) -> None:
        if self.proc and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def stop(self, timeout: float, graceful: bool = True) -> int | None:
        """Exit command, then SIGKILL after `timeout` seconds (at once when not graceful)."""
        if graceful:
            self.send_exit()
            try:
                await asyncio.wait_for(self.exited.wait(), timeout)
            except TimeoutError:
                log.warning("[%s] did not exit within %.0f s: killed", self.tag, timeout)
        self.kill()
        await self.exited.wait()
        return self.returncode
