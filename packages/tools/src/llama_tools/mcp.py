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
import time
from typing import Any

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from .config import BUILTIN_TOOL_NAMES, McpServerSpec
from .mcp_stdio import StdioChild, open_stdio

__all__ = ["McpHub", "McpTool"]

log = logging.getLogger("llama_tools.mcp")


class _QuietNotifications(logging.Filter):
    """The SDK logs a traceback at WARNING for every notification it cannot validate (e.g. a progress
    notification without a token); such notifications are skipped by design, so they go to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Failed to validate notification"):
            log.debug("MCP: skipped a notification the SDK could not validate: %s", record.args)
            return False
        return True


logging.getLogger("client").addFilter(_QuietNotifications())  # the SDK's client session logger

WARMUP_TIMEOUT = 10.0
SPAWN_COOLDOWN = 5.0
_CLIENT = types.Implementation(name="llama.cpp", version="1.0")


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


class _Server:
    """One configured server: at most one live child, owned by a task that enters and leaves the SDK's
    session (anyio scopes must be left by the task that entered them)."""

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.lock = asyncio.Lock()
        self.cooldown_until = 0.0
        self.child: StdioChild | None = None
        self.session: ClientSession | None = None
        self.owner: asyncio.Task[None] | None = None
        self.release = asyncio.Event()

    async def _own(self, ready: asyncio.Future[None]) -> None:
        try:
            async with (
                open_stdio(self.spec) as child,
                ClientSession(child.read, child.write, client_info=_CLIENT) as session,
            ):
                self.child = child
                try:
                    await session.initialize()
                except Exception as e:
                    raise _Handshake(e) from e
                self.session = session
                ready.set_result(None)
                # live until closed, or until the child's stdout ends (it died)
                done = asyncio.ensure_future(self.release.wait())
                dead = asyncio.ensure_future(child.closed.wait())
                try:
                    await asyncio.wait({done, dead}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    done.cancel()
                    dead.cancel()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError("cancelled"))
            if not isinstance(e, Exception):
                raise
        finally:
            self.session = None
            self.child = None

    async def connect(self, timeout: float) -> ClientSession:
        """The live session, spawning the child (and handshaking) when there is none."""
        if self.session is not None and self.child is not None and self.child.alive:
            return self.session
        await self.close()
        if time.monotonic() < self.cooldown_until:
            raise _Unavailable("cooling down after a failed start")
        self.release = asyncio.Event()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.owner = asyncio.ensure_future(self._own(ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout)
        except TimeoutError:  # an OSError too, since Python 3.11: not a spawn failure
            await self.close()
            raise
        except OSError as e:
            self.cooldown_until = time.monotonic() + SPAWN_COOLDOWN
            log.warning("MCP server %s failed to start: %s", self.spec.name, e)
            raise _Unavailable(f"failed to start: {e}") from e
        except BaseException:
            await self.close()
            raise
        assert self.session is not None
        return self.session

    async def close(self) -> None:
        owner, self.owner = self.owner, None
        if owner is None:
            return
        self.release.set()
        if self.session is None:
            owner.cancel()  # still spawning or handshaking: nothing to wind down politely
        try:
            await asyncio.wait_for(asyncio.shield(owner), 3)
        except (TimeoutError, asyncio.CancelledError):
            owner.cancel()
        except Exception as e:  # the child's failure was already reported to the caller
            log.debug("MCP server %s closed with %s", self.spec.name, e)


class _Unavailable(Exception):
    pass


class _Handshake(Exception):
    pass


class McpHub:
    """All configured MCP servers and the tools they offer."""

    def __init__(self, specs: tuple[McpServerSpec, ...]) -> None:
        self.servers = {s.name: _Server(s) for s in specs}
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

    async def _list(self, server: _Server) -> list[McpTool]:
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
        self, server: _Server, tool: McpTool, args: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        async with server.lock:
            try:
                # spawning and the handshake get the warm-up bound; `timeout_ms` is for the call itself
                session = await server.connect(max(timeout, WARMUP_TIMEOUT))
            except _Unavailable:
                return {"error": f"MCP server unavailable: {server.spec.name}"}
            except TimeoutError:
                return {"error": "initialize failed: request timed out"}
            except _Handshake as e:
                return {"error": f"initialize failed: {e.__cause__}"}
            except Exception as e:
                return {"error": f"initialize failed: {e}"}
            child = server.child
            try:
                result = await asyncio.wait_for(session.call_tool(tool.name, args), timeout)
            except TimeoutError:
                return {"error": "request timed out"}
            except MCPError as e:
                if child is None or not child.alive:
                    return {"error": "transport closed"}
                return {"error": e.message}
            except Exception as e:
                if child is None or not child.alive:
                    return {"error": "transport closed"}
                return {"error": str(e) or type(e).__name__}
        return _result(result)

    async def shutdown(self) -> None:
        """Stop every child (calls in flight are ended by the caller first, see ToolsService)."""
        await asyncio.gather(*(s.close() for s in self.servers.values()), return_exceptions=True)


def _result(result: Any) -> dict[str, Any]:
    parts = [c.text for c in getattr(result, "content", []) if isinstance(c, types.TextContent)]
    text = "\n".join(parts)
    if getattr(result, "is_error", False):
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}
