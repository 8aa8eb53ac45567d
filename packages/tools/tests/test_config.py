"""Flags and MCP configuration parsing; the CORS origin policy."""

from __future__ import annotations

import json

import click
import pytest
from llama_tools import CorsPolicy, cors_policy_from_options, tools_config_from_options
from llama_tools.config import BUILTIN_TOOL_NAMES, ToolsConfigError, load_mcp_servers, parse_tools_list


def test_tools_list():
    assert parse_tools_list(None) == ()
    assert parse_tools_list("all") == BUILTIN_TOOL_NAMES
    assert parse_tools_list("get_info, read_file") == ("read_file", "get_info")  # the fixed order
    with pytest.raises(ToolsConfigError) as e:
        parse_tools_list("read_file,rm_rf")
    assert str(e.value) == f'unknown tool "rm_rf". available tools: {", ".join(BUILTIN_TOOL_NAMES)}'


def test_mcp_config_sources(tmp_path):
    f = tmp_path / "mcp.json"
    f.write_text(json.dumps({"mcpServers": {"a": {"command": "x", "args": ["1"], "env": {"K": "V"},
                                                  "cwd": "/tmp", "timeout_ms": 500}, "nocmd": {"args": []}}}))  # fmt: skip
    inline = json.dumps({"mcpServers": {"a": {"command": "dup"}, "b": {"command": "y"}}})
    servers = load_mcp_servers(str(f), inline)
    assert [(s.name, s.command) for s in servers] == [
        ("a", "x"),
        ("b", "y"),
    ]  # the file wins, no command: skipped
    assert servers[0].env == {"K": "V"} and servers[0].timeout_ms == 500 and servers[0].args == ("1",)
    assert servers[1].timeout_ms == 30000
    assert load_mcp_servers(None, "{}") == ()


@pytest.mark.parametrize(
    ("file", "inline", "message"),
    [
        (None, "not valid json", "failed to parse MCP config JSON: "),
        ("/nonexistent/path.json", None, "failed to open MCP config file: /nonexistent/path.json"),
        (None, "[1]", "must be a JSON object"),
        (None, '{"mcpServers": []}', '"mcpServers" must be an object'),
        (
            None,
            '{"mcpServers": {"a": {"command": "x", "args": "y"}}}',
            '"a".args must be an array of strings',
        ),
        (None, '{"mcpServers": {"a": {"command": "x", "timeout_ms": -1}}}', "timeout_ms must be a positive"),
        (None, '{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}', "env must map names to strings"),
    ],
)
def test_mcp_config_errors(file, inline, message):
    with pytest.raises(ToolsConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_mcp_servers(file, inline)


def test_flags_to_config():
    cfg = tools_config_from_options({"agent": True})
    assert cfg.tools == BUILTIN_TOOL_NAMES and cfg.cors_proxy and cfg.enabled
    assert not tools_config_from_options({}).enabled
    assert tools_config_from_options({"ui_mcp_proxy": True}).cors_proxy
    with pytest.raises(click.UsageError, match='unknown tool "x"'):
        tools_config_from_options({"tools": "x"})
    with pytest.raises(click.UsageError, match="invalid ssh target"):
        tools_config_from_options({"tools_runtime": "ssh:-oProxyCommand=x"})


def test_cors_default_switches_with_tools():
    tools = tools_config_from_options({"tools": "read_file"})
    assert cors_policy_from_options({}, tools).origins == "localhost"
    assert cors_policy_from_options({"cors_origins": "*"}, tools).origins == "*"  # explicit wins
    assert cors_policy_from_options({}, tools_config_from_options({})).origins == "*"
    mcp = tools_config_from_options({"mcp_servers_json": '{"mcpServers": {"a": {"command": "x"}}}'})
    assert cors_policy_from_options({}, mcp).origins == "localhost"


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost",
        "http://localhost:8080",
        "http://127.0.0.1",
        "http://127.0.0.1:3000",
        "http://[::1]",
        "http://[::1]:3000",
        "https://localhost:1",
        "localhost",
    ],
)
def test_localhost_reflects(origin):
    assert CorsPolicy(origins="localhost").allow_origin(origin) == origin


@pytest.mark.parametrize(
    "origin",
    [
        "http://web.mydomain.fr",
        "http://evil.com",
        "http://notlocalhost",
        "http://localhost.evil.com",
        "http://127.0.0.1.evil.com",
        "http://[::1",
        "",
        "http://evil.com/?localhost",
        "http://localhost@evil.com",
    ],
)
def test_localhost_rejects(origin):
    assert CorsPolicy(origins="localhost").allow_origin(origin) is None


def test_star_and_literal():
    assert CorsPolicy().allow_origin("web.mydomain.fr") == "web.mydomain.fr"
    assert CorsPolicy().allow_origin("") is None
    assert CorsPolicy(credentials=False).allow_origin("x") == "*"
    assert CorsPolicy(origins="https://a.example").allow_origin("https://b.example") == "https://a.example"
    assert CorsPolicy().response_headers("o", True) == [
        ("Access-Control-Allow-Origin", "o"),
        ("Access-Control-Allow-Credentials", "true"),
        ("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"),
        ("Access-Control-Allow-Headers", "*"),
    ]
    assert CorsPolicy().response_headers("o", False) == [("Access-Control-Allow-Origin", "o")]
