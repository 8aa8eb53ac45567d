"""MCP servers exposed as tools (streams-and-tools.md §3), spoken to with the `mcp` SDK's ClientSession.

Each configured server is warmed up at start-up (spawn, handshake, `tools/list`, shut down; 10 s each, in
parallel; one that fails contributes no tools). A call spawns the server lazily and keeps it running; a
dead child is replaced on the next call, a spawn failure puts the server on a 5 s cooldown. Calls to one
server are serialised, different servers run in parallel. Every outcome is a JSON object for
`POST /tools`: `{"plain_text_response": ...}` or `{"error": ...}`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from .config import BUILTIN_TOOL_NAMES, McpServerSpec

if TYPE_CHECKING:
    from .mcp_session import McpServer

__all__ = ["McpHub", "McpTool"]

log = logging.getLogger("llama_tools.mcp")

WARMUP_TIMEOUT = 10.0
SPAWN_COOLDOWN = 5.0


class McpTool:
    """One tool of one server, listed as `<server>_<tool>`."""

    def __init__(self, server: str, name: str, description: str, schema: dict[str, Any]) -> None:
        self.server = server
        self.name = name
        self.full_name = f"{server}_{name}"
        self.description = description
        self.schema = schema

    def listing(self) -> dict[str, Any]:
        return {
            "display_name": self.full_name,
            "tool": self.full_name,
            "type": "mcp",
            "permissions": {"write": False},
            "uses_cwd": False,
            "definition": {
                "type": "function",
                "function": {
                    "name": self.full_name,
                    "description": self.description,
                    "parameters": self.schema,
                },
            },
        }


class ServerUnavailable(Exception):
    pass


class HandshakeFailed(Exception):
    pass


class McpHub:
    """All configured MCP servers and the tools they offer."""

    def __init__(self, specs: tuple[McpServerSpec, ...]) -> None:
        self.servers: dict[str, McpServer] = {}
        if specs:  # the SDK takes ~0.5 s to import: only a server with MCP servers configured pays it
            from .mcp_session import McpServer

            self.servers = {s.name: McpServer(s) for s in specs}
        self.tools: dict[str, McpTool] = {}

    async def warm_up(self) -> None:
        """List every server's tools (in parallel, bounded per server); failures only log."""
        results = await asyncio.gather(
            *(self._list(s) for s in self.servers.values()), return_exceptions=True
        )
        taken = set(BUILTIN_TOOL_NAMES)
        for server, found in zip(self.servers.values(), results, strict=True):
            if isinstance(found, BaseException):
                log.warning("MCP server %s: no tools (%s)", server.spec.name, found or type(found).__name__)
                continue
            for tool in found:
                if tool.full_name in taken:
                    log.warning("MCP tool %s collides with an existing tool, skipping", tool.full_name)
                    continue
                taken.add(tool.full_name)
                self.tools[tool.full_name] = tool
        if self.tools:
            log.info("MCP: %d tools from %d servers", len(self.tools), len(self.servers))

    async def _list(self, server: McpServer) -> list[McpTool]:
        async def listing() -> list[McpTool]:
            async with server.lock:
                try:
                    session = await server.connect(WARMUP_TIMEOUT)
                    result = await session.list_tools()
                finally:
                    await server.close()
            return [
                McpTool(server.spec.name, t.name, t.description or "", dict(t.input_schema or {}))
                for t in result.tools
            ]

        return await asyncio.wait_for(listing(), WARMUP_TIMEOUT)

    async def call(self, tool: McpTool, arguments: dict[str, Any]) -> dict[str, Any]:
        """`tools/call` on the tool's server, mapped to the result object of `POST /tools`."""
        server = self.servers[tool.server]
        return await self._call(server, tool, arguments, server.spec.timeout_ms / 1000)

    async def _call(
        self, server: McpServer, tool: McpTool, args: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        async with server.lock:
            try:
                # spawning and the handshake get the warm-up bound; `timeout_ms` is for the call itself
                session = await server.connect(max(timeout, WARMUP_TIMEOUT))
            except ServerUnavailable:
                return {"error": f"MCP server unavailable: {server.spec.name}"}
            except TimeoutError:
                return {"error": "initialize failed: request timed out"}
            except HandshakeFailed as e:
                return {"error": f"initialize failed: {e.__cause__}"}
            except Exception as e:
                return {"error": f"initialize failed: {e}"}
            return await server.call(session, tool.name, args, timeout)

    async def shutdown(self) -> None:
        """Stop every child (calls in flight are ended by the caller first, see ToolsService)."""
        await asyncio.gather(*(s.close() for s in self.servers.values()), return_exceptions=True)
