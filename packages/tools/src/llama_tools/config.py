"""The settings of the tools features, decided once from the command line (or by a caller), then read-only.

`ToolsConfig` is what both `llama-server` and `llama-router` build from the same flags (see `cli.py`):
which built-in tools are on, the isolate they run in, the MCP servers, and whether `/cors-proxy` is served.
"""

from __future__ import annotations

import json
import os
from typing import Any

import msgspec

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "McpServerSpec",
    "ToolsConfig",
    "ToolsConfigError",
    "load_mcp_servers",
    "parse_tools_list",
]

# the fixed order of GET /tools (streams-and-tools.md §2.2)
BUILTIN_TOOL_NAMES: tuple[str, ...] = (
    "read_file",
    "file_glob_search",
    "grep_search",
    "exec_shell_command",
    "write_file",
    "edit_file",
    "get_info",
)

DEFAULT_MCP_TIMEOUT_MS = 30000


class ToolsConfigError(ValueError):
    """A tools flag or MCP configuration that cannot be used; the message is what start-up prints."""


class McpServerSpec(msgspec.Struct, frozen=True):
    """One stdio MCP server of the `mcpServers` object (Cursor's format)."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    cwd: str | None = None
    timeout_ms: int = DEFAULT_MCP_TIMEOUT_MS


class ToolsConfig(msgspec.Struct, frozen=True):
    """What the tools flags decide.

    `tools`: the enabled built-in tools, in the fixed order. `runtime`: `--tools-runtime` ("" = the host).
    `cors_proxy`: `/cors-proxy` is served (`--ui-mcp-proxy` or `--agent`). `cors_proxy_allow`: the
    `--cors-proxy-allow` entries, the non-public hosts, addresses and networks it may reach anyway
    (`targets.parse_allow_list` reads them). `mcp_servers`: from
    `--mcp-servers-config` then `--mcp-servers-json`. `root`: `--tools-dir`, the directory the built-in
    tools' host paths and commands are confined to ("" = the working directory; "/" = anywhere).
    """

    tools: tuple[str, ...] = ()
    runtime: str = ""
    cors_proxy: bool = False
    cors_proxy_allow: tuple[str, ...] = ()
    mcp_servers: tuple[McpServerSpec, ...] = ()
    root: str = ""

    @property
    def enabled(self) -> bool:
        """Whether `/tools` is served (built-in tools or MCP servers configured)."""
        return bool(self.tools or self.mcp_servers)


def parse_tools_list(value: str | None) -> tuple[str, ...]:
    """`--tools all|a,b,c` as the enabled names in the fixed order; an unknown name is an error."""
    if not value:
        return ()
    names = [n.strip() for n in value.split(",") if n.strip()]
    if "all" in names:
        return BUILTIN_TOOL_NAMES
    for n in names:
        if n not in BUILTIN_TOOL_NAMES:
            raise ToolsConfigError(f'unknown tool "{n}". available tools: {", ".join(BUILTIN_TOOL_NAMES)}')
    return tuple(n for n in BUILTIN_TOOL_NAMES if n in names)


def _entries(doc: Any, source: str) -> list[McpServerSpec]:
    if not isinstance(doc, dict):
        raise ToolsConfigError(f"MCP config ({source}) must be a JSON object")
    servers = doc.get("mcpServers")
    if servers is None:
        return []  # no servers: the caller warns
    if not isinstance(servers, dict):
        raise ToolsConfigError(f'MCP config ({source}): "mcpServers" must be an object')
    out = []
    for name, entry in servers.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("command"), str) or not entry["command"]:
            continue  # an entry without a command is skipped
        args = entry.get("args") or []
        env = entry.get("env") or {}
        timeout = entry.get("timeout_ms", DEFAULT_MCP_TIMEOUT_MS)
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ToolsConfigError(f'MCP config ({source}): "{name}".args must be an array of strings')
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ToolsConfigError(f'MCP config ({source}): "{name}".env must map names to strings')
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
            raise ToolsConfigError(f'MCP config ({source}): "{name}".timeout_ms must be a positive integer')
        cwd = entry.get("cwd")
        out.append(
            McpServerSpec(
                name=str(name),
                command=entry["command"],
                args=tuple(args),
                env=dict(env),
                cwd=cwd if isinstance(cwd, str) and cwd else None,
                timeout_ms=timeout,
            )
        )
    return out


def load_mcp_servers(config_file: str | None, config_json: str | None) -> tuple[McpServerSpec, ...]:
    """The MCP servers of `--mcp-servers-config FILE` then `--mcp-servers-json JSON`; a name seen in the
    file wins over the same name inline. Raises ToolsConfigError with llama.cpp's start-up messages."""
    docs: list[tuple[Any, str]] = []
    if config_file:
        try:
            with open(os.path.expanduser(config_file), encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ToolsConfigError(f"failed to open MCP config file: {config_file} ({e.strerror})") from None
        docs.append((_decode(text), config_file))
    if config_json:
        docs.append((_decode(config_json), "--mcp-servers-json"))
    seen: dict[str, McpServerSpec] = {}
    for doc, source in docs:
        for spec in _entries(doc, source):
            seen.setdefault(spec.name, spec)  # a duplicate from a later source is skipped
    return tuple(seen.values())


def _decode(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise ToolsConfigError(f"failed to parse MCP config JSON: {e}") from None
