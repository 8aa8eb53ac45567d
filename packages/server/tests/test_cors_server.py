"""The CORS origin policy (endpoints.md §0.6) on the shared server (`*`, credentials on) and the flags
that choose it (cli.md §1.4); the `localhost` policy on a real server is in test_tools_server.py."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import smollm2_path

PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}


@pytest.mark.parametrize(
    ("origin", "header", "value"),
    [
        ("localhost", "Access-Control-Allow-Origin", "localhost"),
        ("web.mydomain.fr", "Access-Control-Allow-Origin", "web.mydomain.fr"),
        ("origin", "Access-Control-Allow-Credentials", "true"),
        ("web.mydomain.fr", "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"),
        ("web.mydomain.fr", "Access-Control-Allow-Headers", "*"),
    ],
)
def test_cors_options_star(client, origin, header, value):
    r = client.options("/completions", headers={"Origin": origin, **PREFLIGHT})
    assert r.status_code == 200 and r.headers[header] == value


def test_star_echoes_on_every_response(client):
    r = client.get("/health", headers={"Origin": "http://anything.example"})
    assert r.headers["access-control-allow-origin"] == "http://anything.example"
    assert "access-control-allow-methods" not in r.headers  # the Allow-* ones are for OPTIONS only


def _config(*args: str, env: dict[str, str] | None = None):
    from llama_server import cli

    seen = {}

    def fake_build(kw):
        seen["cfg"] = build(kw)
        raise SystemExit(0)  # stop before anything starts

    build = cli.build_config
    cli.build_config = fake_build
    try:
        CliRunner().invoke(cli.main, ["-m", str(smollm2_path()), *args], env=env, catch_exceptions=False)
    finally:
        cli.build_config = build
    return seen["cfg"]


@pytest.mark.parametrize(
    ("args", "env", "origins"),
    [
        ((), None, "*"),
        (("--tools", "read_file"), None, "localhost"),
        (("--agent",), None, "localhost"),
        (("--mcp-servers-json", '{"mcpServers": {"a": {"command": "x"}}}'), None, "localhost"),
        (("--tools", "all", "--cors-origins", "*"), None, "*"),
        (("--tools", "all", "--cors-origins", "https://app.example"), None, "https://app.example"),
        (("--tools", "all"), {"LLAMA_ARG_CORS_ORIGINS": "*"}, "*"),
        (("--ui-mcp-proxy",), None, "*"),
    ],
)
def test_origin_default_follows_tools(args, env, origins):
    cfg = _config(*args, env=env)
    assert cfg.cors_origins == origins
    if "--agent" in args:
        assert cfg.tools.cors_proxy and len(cfg.tools.tools) == 7
