"""Running one command for a tool: output capped, a timeout, killed with its whole process group when the
time runs out or the caller goes away (a cancelled task), optionally streamed chunk by chunk."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Sequence

import msgspec

__all__ = ["ExecResult", "kill_group", "run_process", "wait_exit"]

_READ = 16384
# how long the output pipe may stay open after the command itself exited (a background job holding it)
_LINGER = 0.2


class ExecResult(msgspec.Struct, frozen=True):
    """What a command printed (stdout and stderr merged unless asked otherwise) and how it ended."""

    output: bytes
    exit_code: int
    timed_out: bool = False
    truncated: bool = False


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process and everything in its process group (it was started in its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


async def wait_exit(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    """Whether the process exited within `timeout` seconds. Polls `returncode`: asyncio's `wait()` also
    waits for the pipes to close, which a background child holding them delays for as long as it lives."""
    deadline = asyncio.get_running_loop().time() + timeout
    while proc.returncode is None:
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def run_process(
    argv: Sequence[str],
    *,
    max_output: int,
    timeout: float,
    cwd: str | None = None,
    stdin_data: bytes | None = None,
    on_chunk: Callable[[str], Awaitable[None]] | None = None,
    combine_stderr: bool = True,
) -> ExecResult:
    """Run `argv` (no shell of ours) with stdin closed or fed `stdin_data`. Output past `max_output`
    bytes is dropped (`truncated`); `on_chunk` gets each decoded piece that was kept."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin_data is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if combine_stderr else asyncio.subprocess.DEVNULL,
            cwd=cwd or None,
            start_new_session=True,
        )
    except (OSError, ValueError) as e:
        return ExecResult(f"failed to run {argv[0]}: {e}".encode(), 127)
    kept = bytearray()
    truncated = False
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    assert proc.stdout is not None

    async def feed() -> None:
        if stdin_data is not None and proc.stdin is not None:
            with contextlib.suppress(OSError, ConnectionError):
                proc.stdin.write(stdin_data)
                await proc.stdin.drain()
            proc.stdin.close()

    async def pump() -> None:
        nonlocal truncated
        assert proc.stdout is not None
        while data := await proc.stdout.read(_READ):
            room = max_output - len(kept)
            if len(data) > room:
                truncated = True
                data = data[: max(room, 0)]
            if data:
                kept.extend(data)
                if on_chunk is not None:
                    text = decoder.decode(data)
                    if text:
                        await on_chunk(text)

    feeder = asyncio.ensure_future(feed())
    reader = asyncio.ensure_future(pump())
    try:
        timed_out = not await wait_exit(proc, timeout)
        # the command is done (or killed below); a background job may still hold the pipe open
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), 0 if timed_out else _LINGER)
    finally:
        kill_group(proc)
        for task in (reader, feeder):
            task.cancel()
        with contextlib.suppress(BaseException):
            await wait_exit(proc, 5)
        with contextlib.suppress(BaseException):
            await reader
    if on_chunk is not None:
        tail = decoder.decode(b"", final=True)
        if tail:
            await on_chunk(tail)
    # a timed-out command was ended by our SIGKILL: say so even when asyncio's child watcher lost the exit
    # status (it reports 255 for a pid it finds already reaped)
    code = -signal.SIGKILL if timed_out else proc.returncode if proc.returncode is not None else -1
    return ExecResult(bytes(kept), code, timed_out, truncated)
