"""`ToolsService`: the tools an app serves (built-ins, MCP servers, the `--tools-runtime` isolate) and
the request-level rules of `POST /tools` (streams-and-tools.md §2.3): header-supplied `cwd`, `runtime`
and `resp_type` replace model-supplied ones, unknown tools, streaming, and the result of a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

import msgspec

from .builtin import BUILTIN_TOOLS, Tool, make_io
from .config import ToolsConfig
from .mcp import McpHub, McpTool
from .proxy import CorsProxy
from .runtime import ToolsRuntime
from .targets import parse_allow_list

__all__ = ["ToolError", "ToolsService"]

log = logging.getLogger("llama_tools")
T = TypeVar("T")

# header -> the params key it replaces (set by the runtime, never by the model)
_HEADER_PARAMS = (("x-tool-cwd", "cwd"), ("x-tool-runtime", "runtime"), ("x-resp-type", "resp_type"))


class ToolError(Exception):
    """A request `POST /tools` refuses: HTTP `status`, flat body `{"code", "message", "type"}`."""

    def __init__(
        self, status: int, message: str, code: int | None = None, kind: str = "invalid_request_error"
    ):
        super().__init__(message)
        self.status = status
        self.code = code if code is not None else status
        self.message = message
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "type": self.kind}


class _Stopped(Exception):
    pass


class ToolsService:
    """Everything `/tools` needs, built once from a ToolsConfig; `startup()`/`shutdown()` (or `lifespan`)
    start and stop the MCP children and the owned container."""

    def __init__(self, config: ToolsConfig) -> None:
        self.config = config
        self.builtin: dict[str, Tool] = {n: BUILTIN_TOOLS[n] for n in config.tools}
        self.mcp = McpHub(config.mcp_servers)
        self.runtime = ToolsRuntime(config.runtime) if config.runtime else None
        self.proxy = CorsProxy(parse_allow_list(config.cors_proxy_allow))
        self.stopping = asyncio.Event()
        # the built-in tools' host paths stay below this directory (symbolic links resolved)
        self.root = os.path.realpath(config.root or os.getcwd())

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    async def startup(self) -> None:
        """Warm the MCP servers up (their tools are listed from then on) and start an owned container."""
        self.stopping = asyncio.Event()
        if self.config.mcp_servers:
            await self.mcp.warm_up()
        if self.runtime is not None and self.runtime.owned:
            await self.runtime.call_spec()

    def begin_shutdown(self) -> None:
        """Calls in flight end now (`{"error": "cancelled"}`, a stream's final event); safe to call twice."""
        self.stopping.set()

    async def shutdown(self) -> None:
        self.begin_shutdown()
        await self.mcp.shutdown()
        await self.proxy.aclose()
        if self.runtime is not None:
            await self.runtime.stop()

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Any = None) -> AsyncIterator[None]:
        """For Litestar's `lifespan=[...]`."""
        await self.startup()
        try:
            yield
        finally:
            await self.shutdown()

    def listing(self) -> list[dict[str, Any]]:
        """`GET /tools`: the enabled built-ins in the fixed order, then the MCP tools."""
        return [t.listing() for t in self.builtin.values()] + [t.listing() for t in self.mcp.tools.values()]

    def find(self, name: str, stream: bool) -> Tool | McpTool:
        tool: Tool | McpTool | None = self.builtin.get(name) or self.mcp.tools.get(name)
        if tool is None:
            raise ToolError(404, f'unknown tool "{name}"', code=400)
        if stream and not (isinstance(tool, Tool) and tool.stream):
            raise ToolError(404, f'tool "{name}" does not support stream = true', code=400)
        return tool

    @staticmethod
    def parse_body(raw: bytes) -> tuple[str, dict[str, Any], bool]:
        """`(tool, params, stream)` of a request body; ToolError 400 when it has the wrong shape."""
        try:
            body = msgspec.json.decode(raw) if raw.strip() else None
        except (msgspec.DecodeError, RecursionError) as e:
            raise ToolError(400, f"Invalid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ToolError(400, "the request body must be a JSON object")
        tool = body.get("tool")
        if not isinstance(tool, str):
            raise ToolError(400, '"tool" is required and must be a string')
        params = body.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ToolError(400, '"params" must be an object')
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ToolError(400, '"stream" must be a boolean')
        return tool, params, stream

    async def prepare(self, params: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
        """The params a tool sees: `cwd`/`runtime`/`resp_type` always stripped, then set from headers
        (the runtime falls back to `--tools-runtime`)."""
        out = {k: v for k, v in params.items() if k not in ("cwd", "runtime", "resp_type")}
        for header, key in _HEADER_PARAMS:
            value = headers.get(header, "")
            if value:
                out[key] = value
        if "runtime" not in out and self.runtime is not None:
            out["runtime"] = await self.runtime.call_spec()
        return out

    async def invoke(self, tool: Tool | McpTool, params: dict[str, Any]) -> dict[str, Any]:
        """One non-streamed call. ParamError (400) and RuntimeSpecError (500) propagate."""
        try:
            if isinstance(tool, McpTool):
                return await self._until_stopped(self.mcp.call(tool, params))
            args = tool.arguments(params)
            io = make_io(args.get("runtime", ""), args.get("cwd", ""), root=self.root)
            return await self._until_stopped(tool.call(args, io))
        except _Stopped:
            return {"error": "cancelled"}

    async def stream(self, tool: Tool, params: dict[str, Any]) -> AsyncIterator[bytes]:
        """A streamed call as SSE events: `{"chunk"}`... then one `{"done": true[, "error"]}`. Closing the
        iterator (the client went away) cancels the call, which kills its command."""
        queue: asyncio.Queue[str | None] = asyncio.Queue()

        async def on_chunk(text: str) -> None:
            queue.put_nowait(text)

        async def produce() -> None:
            try:
                args = tool.arguments(params)
                io = make_io(args.get("runtime", ""), args.get("cwd", ""), root=self.root)
                await self._until_stopped(tool.call(args, io, on_chunk))
            finally:
                queue.put_nowait(None)

        task = asyncio.ensure_future(produce())
        try:
            while (chunk := await queue.get()) is not None:
                yield _event({"chunk": chunk})
            error = None
            try:
                task.result()
            except _Stopped:
                error = "cancelled"
            except Exception as e:
                error = str(e) or type(e).__name__
            yield _event({"done": True, "error": error} if error else {"done": True})
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _until_stopped(self, work: Awaitable[T]) -> T:
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            stop.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise _Stopped
        return task.result()


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"
