"""Shared helpers: running one tool on the host against a temporary directory."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llama_tools.builtin import BUILTIN_TOOLS, make_io


def call(name: str, params: dict[str, Any], cwd: str = "", runtime: str = "") -> dict[str, Any]:
    """One built-in tool call as `POST /tools` makes it (defaults filled, the IO for cwd/runtime)."""
    tool = BUILTIN_TOOLS[name]
    args = tool.arguments(params)

    async def go() -> dict[str, Any]:
        return await tool.run(args, make_io(runtime, cwd), None)

    return asyncio.run(go())


@pytest.fixture
def tool_call():
    return call
