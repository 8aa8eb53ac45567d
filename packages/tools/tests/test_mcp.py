"""MCP servers as real child processes (tests/mcp_test_server.py, the SDK's MCPServer): listing, calls,
and each failure mode of streams-and-tools.md §3."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from llama_tools.config import McpServerSpec, ToolsConfig
from llama_tools.mcp import McpHub, McpTool
from llama_tools.service import ToolsService

SERVER = str(Path(__file__).with_name("mcp_test_server.py"))


def spec(name: str, *args: str, timeout_ms: int = 30000, command: str = sys.executable) -> McpServerSpec:
    return McpServerSpec(name=name, command=command, args=(SERVER, *args), timeout_ms=timeout_ms)


def test_listing_calls_and_failures():
    async def go():
        hub = McpHub((spec("t", timeout_ms=1500), spec("bad", command="/nonexistent/mcp-server")))
        start = time.monotonic()
        await hub.warm_up()
        warm = time.monotonic() - start
        tools = hub.tools
        out = {"warm": warm, "names": sorted(tools), "echo": tools["t_echo"].listing()}
        out["echo_call"] = await hub.call(tools["t_echo"], {"message": "hello world", "cwd": "/tmp"})
        out["add"] = await hub.call(tools["t_add"], {"a": 3, "b": 5})
        out["fail"] = await hub.call(tools["t_fail"], {"message": "it broke"})
        out["notify"] = await hub.call(tools["t_notify"], {"message": "n"})
        out["timeout"] = await hub.call(tools["t_slow"], {"seconds": 5})
        out["after_timeout"] = await hub.call(tools["t_echo"], {"message": "still here"})
        pid = await hub.call(tools["t_pid"], {})
        out["crash"] = await hub.call(tools["t_crash"], {})
        out["respawned_count"] = await hub.call(tools["t_count"], {})
        out["new_pid"] = (await hub.call(tools["t_pid"], {}))["plain_text_response"] != pid[
            "plain_text_response"
        ]
        out["burst"] = [await hub.call(tools["t_echo"], {"message": f"m{i}"}) for i in range(20)]
        out["concurrent"] = await asyncio.gather(
            *(hub.call(tools["t_echo"], {"message": str(i)}) for i in range(10))
        )
        bad = McpTool("bad", "echo", "", {})
        out["bad"] = await hub.call(bad, {})
        await hub.shutdown()
        return out

    out = asyncio.run(go())
    assert out["warm"] < 10
    assert out["names"] == ["t_add", "t_count", "t_crash", "t_echo", "t_fail", "t_notify", "t_pid", "t_slow"]
    echo = out["echo"]
    assert echo["tool"] == "t_echo" and echo["type"] == "mcp" and echo["permissions"] == {"write": False}
    fn = echo["definition"]["function"]
    assert echo["definition"]["type"] == "function" and fn["name"] == "t_echo" and fn["description"]
    assert fn["parameters"]["type"] == "object" and "message" in fn["parameters"]["properties"]
    assert out["echo_call"] == {"plain_text_response": "echo: hello world"}
    assert out["add"] == {"plain_text_response": "8.0"}
    assert "it broke" in out["fail"]["error"]
    assert out["notify"] == {"plain_text_response": "notified: n"}
    assert out["timeout"] == {"error": "request timed out"}
    assert out["after_timeout"] == {"plain_text_response": "echo: still here"}  # the stale reply is skipped
    assert out["crash"] == {"error": "transport closed"}
    assert out["respawned_count"] == {"plain_text_response": "1"} and out["new_pid"]
    assert out["burst"] == [{"plain_text_response": f"echo: m{i}"} for i in range(20)]
    assert out["concurrent"] == [{"plain_text_response": f"echo: {i}"} for i in range(10)]
    assert out["bad"] == {"error": "MCP server unavailable: bad"}


def test_handshake_failure_and_empty_warm_up():
    async def go():
        hub = McpHub((spec("x", "--exit"),))
        await hub.warm_up()
        res = await hub.call(McpTool("x", "echo", "", {}), {})
        await hub.shutdown()
        return hub.tools, res

    tools, res = asyncio.run(go())
    assert tools == {}
    assert res["error"].startswith("initialize failed")


def test_grandchild_holding_the_pipes_does_not_stall():
    async def go():
        hub = McpHub((spec("gc", "--grandchild"),))
        t0 = time.monotonic()
        await hub.warm_up()
        warm = time.monotonic() - t0
        res = await hub.call(hub.tools["gc_echo"], {"message": "hello"})
        t0 = time.monotonic()
        await hub.shutdown()
        return warm, res, time.monotonic() - t0

    warm, res, stop = asyncio.run(go())
    assert res == {"plain_text_response": "echo: hello"}
    assert warm < 10 and stop < 2  # the warm-up bound; the start of a Python child is slow on 2 busy cores


def test_shutdown_during_a_slow_call_answers_cancelled():
    async def go():
        service = ToolsService(ToolsConfig(mcp_servers=(spec("s"),)))
        await service.startup()
        call = asyncio.ensure_future(service.invoke(service.find("s_slow", False), {"seconds": 20}))
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        service.begin_shutdown()
        res = await call
        answered = time.monotonic() - t0
        await service.shutdown()
        return res, answered, time.monotonic() - t0

    res, answered, stopped = asyncio.run(go())
    assert res == {"error": "cancelled"} and answered < 0.5 and stopped < 2.5
