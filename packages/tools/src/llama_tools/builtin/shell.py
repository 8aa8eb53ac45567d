"""`exec_shell_command` (streamable) and `get_info` (streams-and-tools.md §2.4)."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

from .base import Tool, opt, req
from .io import ToolsIO

__all__ = ["EXEC_SHELL_COMMAND", "GET_INFO"]

MAX_OUTPUT = 16 * 1024
MAX_TIMEOUT = 60
DEFAULT_TIMEOUT = 10
_INFO_TIMEOUT = 5
_INFO_MAX = 4096


def _shell(command: str, io: ToolsIO) -> list[str]:
    # an isolate is always POSIX
    if sys.platform == "win32" and not io.isolated:
        return ["cmd", "/c", command]
    return ["sh", "-c", command]


async def _exec_shell_command(
    p: dict[str, Any], io: ToolsIO, on_chunk: Callable[[str], Awaitable[None]] | None
) -> dict[str, Any]:
    # the model picks these: clamp both, and a negative or zero timeout is as short as it gets
    timeout = min(max(p["timeout"], 1), MAX_TIMEOUT)
    max_output = min(max(p["max_output_size"], 0), MAX_OUTPUT)
    res = await io.run(_shell(p["command"], io), max_output, timeout, on_chunk)
    tail = f"\n[exit code: {res.exit_code}]"
    if res.timed_out:
        tail += " [exit due to timed out]"
    if on_chunk is not None:
        if res.truncated:
            await on_chunk("\n[output truncated]")
        await on_chunk(tail)
        return {}
    text = res.output.decode("utf-8", "replace")
    if res.truncated:
        text += "\n[output truncated]"
    return {"plain_text_response": text + tail}


async def _get_info(p: dict[str, Any], io: ToolsIO, _: Any) -> dict[str, Any]:
    argv = ["cmd", "/c", "ver"] if sys.platform == "win32" and not io.isolated else ["uname", "-a"]
    res = await io.run(argv, _INFO_MAX, _INFO_TIMEOUT)
    os_info = (
        res.output.decode("utf-8", "replace").strip() if res.exit_code == 0 and not res.timed_out else ""
    )
    cwd = p.get("cwd") or ""
    if not cwd:
        if io.isolated:
            pwd = await io.run(["pwd"], _INFO_MAX, _INFO_TIMEOUT)
            ok = pwd.exit_code == 0 and not pwd.timed_out
            cwd = pwd.output.decode("utf-8", "replace").strip() if ok else "unknown"
        else:
            cwd = io.workdir()
    return {"os": os_info or "unknown", "cwd": cwd}


EXEC_SHELL_COMMAND = Tool(
    name="exec_shell_command",
    display_name="Execute shell command",
    description="Execute a shell command and return its output (stdout and stderr combined).",
    params=(
        req("command", "string", "Shell command to execute"),
        opt(
            "timeout",
            "integer",
            f"Timeout in seconds (default {DEFAULT_TIMEOUT}, max {MAX_TIMEOUT})",
            DEFAULT_TIMEOUT,
        ),
        opt(
            "max_output_size",
            "integer",
            f"Maximum output size in bytes (default and max {MAX_OUTPUT})",
            MAX_OUTPUT,
        ),
    ),
    run=_exec_shell_command,
    write=True,
    stream=True,
)

GET_INFO = Tool(
    name="get_info",
    display_name="Get Runtime Info",
    description="Returns runtime info: the OS name/version and the current working directory",
    params=(),
    run=_get_info,
)
