"""The stdio transport under the `mcp` SDK's `ClientSession`: one child process per MCP server, one JSON
message per line on its stdin/stdout, its stderr drained to the debug log.

The SDK's own `stdio_client` waits 2 s for a child to exit after closing its stdin, then 2 s more after
SIGTERM, and does not expose the process. A server with a slow call in flight would then hold shutdown
for seconds, and a dead child could only be noticed through a failed call. This transport keeps the
process (`returncode` tells a dead child before the next call), gives a child 0.2 s after its stdin
closes and 0.2 s more after SIGTERM to its process group, then kills the whole group (a grandchild holding
the pipes open cannot stall anything).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from .builtin.process import kill_group, wait_exit
from .config import McpServerSpec

__all__ = ["StdioChild", "open_stdio"]

log = logging.getLogger("llama_tools.mcp")

_LINE_LIMIT = 64 * 1024 * 1024  # one message per line; a longer line ends the transport
_EXIT_GRACE = 0.2  # after its stdin closes
_TERM_GRACE = 0.2  # after SIGTERM, before SIGKILL


@dataclass
class StdioChild:
    """The running child and the SDK-side streams of its transport."""

    proc: asyncio.subprocess.Process
    read: MemoryObjectReceiveStream[SessionMessage | Exception]
    write: MemoryObjectSendStream[SessionMessage]
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # stdout ended or stdin broke

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and not self.closed.is_set()


async def _pump_stdout(child: StdioChild, sink: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
    assert child.proc.stdout is not None
    try:
        async with sink:
            while line := await child.proc.stdout.readline():
                text = line.decode("utf-8", "replace").strip()
                if not text:
                    continue
                try:
                    message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
                except ValueError:
                    log.debug("MCP: skipping a line that is not a JSON-RPC message: %.200s", text)
                    continue
                await sink.send(SessionMessage(message))
    except (ValueError, OSError, anyio.ClosedResourceError, anyio.BrokenResourceError) as e:
        log.debug("MCP: stdout of pid %s ended: %s", child.proc.pid, e)
    finally:
        child.closed.set()


async def _pump_stdin(child: StdioChild, source: MemoryObjectReceiveStream[SessionMessage]) -> None:
    stdin = child.proc.stdin
    assert stdin is not None
    try:
        async with source:
            async for message in source:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                stdin.write(data.encode() + b"\n")
                await stdin.drain()
    except (OSError, anyio.ClosedResourceError, anyio.BrokenResourceError):
        child.closed.set()


async def _drain_stderr(proc: asyncio.subprocess.Process, name: str) -> None:
    assert proc.stderr is not None
    with contextlib.suppress(OSError, ValueError):
        while line := await proc.stderr.readline():
            log.debug("MCP %s: %s", name, line.decode("utf-8", "replace").rstrip())


def _terminate_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)


@contextlib.asynccontextmanager
async def open_stdio(spec: McpServerSpec) -> AsyncIterator[StdioChild]:
    """Spawn the server (OSError when it cannot be), yield its transport, and on exit close its stdin,
    wait briefly, SIGTERM its process group, wait briefly again, then kill the group."""
    proc = await asyncio.create_subprocess_exec(
        spec.command,
        *spec.args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **spec.env},  # merged over this process's own environment
        cwd=spec.cwd,
        start_new_session=True,
        limit=_LINE_LIMIT,
    )
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](64)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](64)
    child = StdioChild(proc, read_recv, write_send)
    tasks = [
        asyncio.ensure_future(_pump_stdout(child, read_send)),
        asyncio.ensure_future(_pump_stdin(child, write_recv)),
        asyncio.ensure_future(_drain_stderr(proc, spec.name)),
    ]
    try:
        yield child
    finally:
        if proc.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                proc.stdin.close()
        with contextlib.suppress(BaseException):
            if not await wait_exit(proc, _EXIT_GRACE):
                _terminate_group(proc)  # a child busy in a call reads no EOF: ask it to stop, then kill
                await wait_exit(proc, _TERM_GRACE)
        kill_group(proc)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(BaseException):
            await wait_exit(proc, 2)
        for stream in (read_recv, write_send, read_send, write_recv):
            stream.close()
