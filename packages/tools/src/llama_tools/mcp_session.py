"""One configured MCP server spoken to with the `mcp` SDK's ClientSession: at most one live child (see mcp.py
for the lifecycle). Imported only when MCP servers are configured."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from .config import McpServerSpec
from .mcp import SPAWN_COOLDOWN, HandshakeFailed, ServerUnavailable, log
from .mcp_stdio import StdioChild, open_stdio


class _QuietNotifications(logging.Filter):
    """The SDK logs a traceback at WARNING for every notification it cannot validate (e.g. a progress
    notification without a token); such notifications are skipped by design, so they go to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Failed to validate notification"):
            log.debug("MCP: skipped a notification the SDK could not validate: %s", record.args)
            return False
        return True


logging.getLogger("client").addFilter(_QuietNotifications())  # the SDK's client session logger

_CLIENT = types.Implementation(name="llama.cpp", version="1.0")


class McpServer:
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
                    raise HandshakeFailed(e) from e
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
            raise ServerUnavailable("cooling down after a failed start")
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
            raise ServerUnavailable(f"failed to start: {e}") from e
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

    async def call(
        self, session: ClientSession, name: str, args: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        """`tools/call` on ``session``, the one `connect` returned (the caller holds the lock)."""
        child = self.child
        try:
            result = await asyncio.wait_for(session.call_tool(name, args), timeout)
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


def _result(result: Any) -> dict[str, Any]:
    parts = [c.text for c in getattr(result, "content", []) if isinstance(c, types.TextContent)]
    text = "\n".join(parts)
    if getattr(result, "is_error", False):
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}
