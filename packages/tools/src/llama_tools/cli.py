"""The command-line flags of the tools features and of the CORS policy, shared by `llama-server` and
`llama-router` (cli.md §1.4): click decorators and the functions that turn the parsed values into
`ToolsConfig` and `CorsPolicy`. Invalid values raise `click.UsageError`, which aborts start-up."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .builtin.io import RuntimeSpecError
from .config import ToolsConfig, ToolsConfigError, load_mcp_servers, parse_tools_list
from .cors import CorsPolicy, cors_origins_default
from .runtime import check_runtime_spec
from .targets import parse_allow_list

__all__ = ["cors_options", "cors_policy_from_options", "tools_config_from_options", "tools_options"]

log = logging.getLogger("llama_tools")
F = TypeVar("F", bound=Callable[..., Any])


def tools_options(f: F) -> F:
    """`--tools`, `--tools-runtime`, `-ag/--agent`, `--mcp-servers-config`, `--mcp-servers-json`,
    `--ui-mcp-proxy`, `--cors-proxy-allow`."""
    o = click.option
    options = [
        o("--tools", "tools", envvar="LLAMA_ARG_TOOLS",
          help="Built-in tools to enable: all, or names from read_file, file_glob_search, grep_search, "
          "exec_shell_command, write_file, edit_file, get_info."),
        o("--tools-dir", "tools_dir", envvar="LLAMA_ARG_TOOLS_DIR", metavar="DIR",
          help="Directory the built-in tools may read, write and run commands in (symbolic links and .. "
          "resolved; anything outside is refused) [default: the working directory; / = anywhere]."),
        o("--tools-runtime", envvar="LLAMA_ARG_TOOLS_RUNTIME",
          help="Run every tool in an isolate: docker:<image>, podman:<image>, docker-container:<id>, "
          "podman-container:<id> or ssh:<target>."),
        o("-ag/-no-ag", "--agent/--no-agent", "agent", default=False, envvar="LLAMA_ARG_AGENT",
          help="Same as --tools all plus --ui-mcp-proxy."),
        o("--mcp-servers-config", envvar="LLAMA_ARG_MCP_SERVERS_CONFIG",
          help='MCP servers JSON file ({"mcpServers": {...}}, stdio servers).'),
        o("--mcp-servers-json", envvar="LLAMA_ARG_MCP_SERVERS_JSON", help="MCP servers JSON, inline."),
        o("--ui-mcp-proxy/--no-ui-mcp-proxy", "--webui-mcp-proxy/--no-webui-mcp-proxy", "ui_mcp_proxy",
          default=False, envvar="LLAMA_ARG_UI_MCP_PROXY", help="Serve /cors-proxy for the web UI."),
        o("--cors-proxy-allow", "cors_proxy_allow", envvar="LLAMA_ARG_CORS_PROXY_ALLOW", metavar="LIST",
          help="Non-public targets /cors-proxy may reach anyway (it refuses loopback, private, link-local "
          "and other non-public addresses): comma-separated host names, IP addresses and CIDR networks, "
          "each optionally with :port (IPv6 as [addr]:port), e.g. localhost:8080,10.0.0.0/8."),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


def cors_options(f: F) -> F:
    """`--cors-origins` (no default here: unset means `*`, or `localhost` with tools/MCP), `--cors-methods`,
    `--cors-headers`, `--cors-credentials/--no-cors-credentials`."""
    o = click.option
    options = [
        o("--cors-origins", default=None, envvar="LLAMA_ARG_CORS_ORIGINS",
          help="*, localhost (loopback origins only) or a literal origin [default: *, localhost with tools]"),
        o("--cors-methods", default="GET, POST, DELETE, OPTIONS", envvar="LLAMA_ARG_CORS_METHODS"),
        o("--cors-headers", default="*", envvar="LLAMA_ARG_CORS_HEADERS"),
        o("--cors-credentials/--no-cors-credentials", default=True, envvar="LLAMA_ARG_CORS_CREDENTIALS"),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


def tools_config_from_options(kw: dict[str, Any]) -> ToolsConfig:
    """The ToolsConfig of the parsed flags (reads the MCP config file)."""
    try:
        tools = parse_tools_list("all" if kw.get("agent") else kw.get("tools"))
        servers = load_mcp_servers(kw.get("mcp_servers_config"), kw.get("mcp_servers_json"))
        runtime = kw.get("tools_runtime") or ""
        check_runtime_spec(runtime)
        root = _tools_dir(kw.get("tools_dir"))
        allow = _cors_proxy_allow(kw.get("cors_proxy_allow"))
    except (ToolsConfigError, RuntimeSpecError) as e:
        raise click.UsageError(str(e)) from None
    if (kw.get("mcp_servers_config") or kw.get("mcp_servers_json")) and not servers:
        log.warning('MCP config has no usable servers (missing "mcpServers" or entries without a command)')
    return ToolsConfig(
        tools=tools,
        runtime=runtime,
        cors_proxy=bool(kw.get("ui_mcp_proxy") or kw.get("agent")),
        cors_proxy_allow=allow,
        mcp_servers=servers,
        root=root,
    )


def _cors_proxy_allow(value: str | None) -> tuple[str, ...]:
    """`--cors-proxy-allow` as its entries, each checked now so that a bad one stops start-up."""
    entries = tuple(e.strip() for e in (value or "").split(",") if e.strip())
    try:
        parse_allow_list(entries)
    except ValueError as e:
        raise ToolsConfigError(str(e)) from None
    return entries


def _tools_dir(value: str | None) -> str:
    """`--tools-dir` resolved once at start-up (default: the working directory); it must exist."""
    root = os.path.realpath(os.path.expanduser(value) if value else os.getcwd())
    if not os.path.isdir(root):
        raise ToolsConfigError(f"--tools-dir: not a directory: {value}")
    return root


def cors_policy_from_options(kw: dict[str, Any], tools: ToolsConfig) -> CorsPolicy:
    """The CorsPolicy of the parsed flags; tools or MCP switch an unset `--cors-origins` to `localhost`."""
    return CorsPolicy(
        origins=cors_origins_default(kw.get("cors_origins"), tools.enabled),
        methods=kw.get("cors_methods", CorsPolicy.methods),
        headers=kw.get("cors_headers", CorsPolicy.headers),
        credentials=kw.get("cors_credentials", True),
    )
