"""The MCP server the tests start as a real child process (the `mcp` SDK's MCPServer, ex-FastMCP, stdio).

Arguments: `--grandchild` leaves a sleeping grandchild holding the stdio pipes; `--exit` exits before the
handshake (a server that fails to start).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("test")
logging.disable(logging.CRITICAL)  # its rich log handler takes seconds to render a first record
calls = {"n": 0}


@server.tool()
def echo(message: str) -> str:
    """Echo back the input message."""
    return f"echo: {message}"


@server.tool()
def add(a: float, b: float) -> str:
    """Add two numbers."""
    return str(a + b)


@server.tool()
def fail(message: str) -> str:
    """Always fails with the message (a tool error: `isError` in the result)."""
    raise ToolError(message)


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "slept"


@server.tool()
def crash() -> str:
    """Exit the process in the middle of the call."""
    os._exit(1)


@server.tool()
def count() -> str:
    """Calls answered by this process."""
    calls["n"] += 1
    return str(calls["n"])


@server.tool()
def pid() -> str:
    """The process id."""
    return str(os.getpid())


@server.tool()
async def notify(message: str, ctx: Context) -> str:
    """Sends log and progress notifications before the answer."""
    await ctx.info(f"working on {message}")
    await ctx.report_progress(50, 100)
    return f"notified: {message}"


if __name__ == "__main__":
    if "--exit" in sys.argv:
        sys.exit(3)
    if "--grandchild" in sys.argv:
        # inherits stdin/stdout/stderr and outlives this process
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    server.run("stdio")
