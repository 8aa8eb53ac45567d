"""The addresses `/cors-proxy` may reach: every spelling of a non-public address is recognised as one,
public addresses stay reachable, and `--cors-proxy-allow` is parsed and matched as documented."""

from __future__ import annotations

import asyncio
import ipaddress

import click
import pytest
from click.testing import CliRunner
from llama_tools import tools_config_from_options, tools_options
from llama_tools.targets import (
    TargetPolicy,
    TargetRefused,
    classify,
    parse_allow_list,
    parse_ip,
    system_resolver,
)

# (how a URL may write the host, what it is)
FORBIDDEN = [
    ("127.0.0.1", "loopback"),
    ("127.255.0.9", "loopback"),
    ("2130706433", "loopback"),  # decimal
    ("0x7f000001", "loopback"),  # hexadecimal
    ("0X7F.0.0.1", "loopback"),
    ("0177.0.0.1", "loopback"),  # octal
    ("017700000001", "loopback"),
    ("127.1", "loopback"),  # short forms
    ("127.0.1", "loopback"),
    ("0x7f.1", "loopback"),
    ("127.0.0.1.", "loopback"),  # the root's trailing dot
    ("::1", "loopback"),
    ("[::1]", "loopback"),
    ("0:0:0:0:0:0:0:1", "loopback"),
    ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
    ("[::ffff:7f00:1]", "loopback"),
    ("::127.0.0.1", "loopback"),  # IPv4-compatible (deprecated)
    ("2002:7f00:1::", "loopback"),  # 6to4
    ("64:ff9b::127.0.0.1", "loopback"),  # NAT64
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),  # Teredo, client 127.0.0.1 (stored inverted)
    ("0.0.0.0", "unspecified"),
    ("0", "unspecified"),
    ("::", "unspecified"),
    ("::ffff:0.0.0.0", "unspecified"),
    ("10.0.0.1", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.254", "private"),
    ("192.168.0.1", "private"),
    ("0xc0a80001", "private"),
    ("::ffff:10.0.0.1", "private"),
    ("2002:c0a8:1::1", "private"),
    ("64:ff9b::10.1.2.3", "private"),
    ("64:ff9b:1::1", "private"),  # local-use NAT64
    ("100.64.0.1", "shared (CGNAT)"),
    ("100.127.255.254", "shared (CGNAT)"),
    ("169.254.169.254", "link-local"),  # cloud metadata
    ("2852039166", "link-local"),
    ("::ffff:169.254.169.254", "link-local"),
    ("fe80::1", "link-local"),
    ("fe80::1%25eth0", "link-local"),  # a zone id, as a URL writes it
    ("fe80::1%eth0", "link-local"),
    ("fd00:ec2::254", "unique-local"),  # cloud metadata over IPv6
    ("fc00::1", "unique-local"),
    ("fec0::1", "site-local"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("ff02::1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),  # the limited broadcast
    ("192.0.0.8", "reserved"),
    ("100::1", "reserved"),  # discard-only
    ("2001:10::1", "reserved"),
    ("5f00::1", "reserved"),  # outside global unicast
    ("192.0.2.1", "documentation"),
    ("198.51.100.1", "documentation"),
    ("203.0.113.1", "documentation"),
    ("2001:db8::1", "documentation"),
    ("3fff::1", "documentation"),
    ("198.18.0.1", "benchmarking"),
    ("2001:2::1", "benchmarking"),
]

PUBLIC = [
    "93.184.216.34",
    "1.1.1.1",
    "8.8.8.8",
    "1572395042",  # 93.184.216.34 in decimal
    "2606:4700::1111",
    "2a00:1450:4001:80b::200e",
    "::ffff:93.184.216.34",
    "2002:5db8:d822::1",  # 6to4 of a public address
    "64:ff9b::93.184.216.34",  # NAT64 of a public address
    "100.128.0.1",  # just past CGNAT
    "172.32.0.1",  # just past 172.16.0.0/12
]


@pytest.mark.parametrize(("host", "why"), FORBIDDEN)
def test_forbidden_in_every_spelling(host, why):
    ip = parse_ip(host)
    assert ip is not None, host
    assert classify(ip) == why


@pytest.mark.parametrize("host", PUBLIC)
def test_public_addresses_stay_allowed(host):
    ip = parse_ip(host)
    assert ip is not None and classify(ip) is None


@pytest.mark.parametrize(
    "host", ["localhost", "example.com", "1.2.3.4.5", "256.1.1.1", "0x", "08.0.0.1", "::g"]
)
def test_names_are_not_literals(host):
    """Not an address in any spelling: a name for the resolver (whose answers are checked in turn)."""
    assert parse_ip(host) is None


def test_system_resolver_reads_numeric_spellings_the_same_way():
    """What the system resolver makes of a host agrees with `parse_ip`, so the spelling never matters."""
    for host in ("2130706433", "0x7f000001", "127.1", "0177.0.0.1", "localhost"):
        found = asyncio.run(system_resolver(host, 80))
        assert found and all(classify(ipaddress.ip_address(a)) == "loopback" for a in found), (host, found)


def test_allow_list_parsing():
    entries = parse_allow_list(
        " localhost:8080, 127.0.0.1:9000,10.0.0.0/8 ,[::1]:8080,::1,fd00::/8,[fd00::/8]:443,MCP.Internal.,127.1,,"
    )
    got = [(e.name, str(e.network) if e.network else None, e.port) for e in entries]
    assert got == [
        ("localhost", None, 8080),
        ("", "127.0.0.1/32", 9000),
        ("", "10.0.0.0/8", None),
        ("", "::1/128", 8080),
        ("", "::1/128", None),
        ("", "fd00::/8", None),
        ("", "fd00::/8", 443),
        ("mcp.internal", None, None),  # names compare without case and trailing dot
        ("", "127.0.0.1/32", None),  # an address in any spelling is an address
    ]
    assert parse_allow_list("") == () and parse_allow_list(None) == ()
    assert parse_allow_list(("10.0.0.0/8",))[0].network == ipaddress.ip_network("10.0.0.0/8")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a b", "invalid entry 'a b': not a host name, IP address or CIDR network"),
        ("localhost:0", "invalid entry 'localhost:0': invalid port '0'"),
        ("localhost:70000", "invalid port '70000'"),
        ("localhost:x", "invalid port 'x'"),
        ("[::1", "unbalanced ["),
        ("[::1]8080", "expected :port after ]"),
        ("10.0.0.0/33", "invalid entry '10.0.0.0/33'"),
        ("fd00::/129", "invalid entry 'fd00::/129'"),
        ("-bad.example", "not a host name"),
        ("ok.example,http://x", "invalid entry 'http://x'"),
    ],
)
def test_allow_list_errors(value, message):
    with pytest.raises(ValueError, match=r"^--cors-proxy-allow: ") as e:
        parse_allow_list(value)
    assert message in str(e.value)


def test_allow_list_flag_and_env():
    """`--cors-proxy-allow` and `LLAMA_ARG_CORS_PROXY_ALLOW` reach ToolsConfig; a bad entry stops start-up."""

    @click.command()
    @tools_options
    def cmd(**kw):
        click.echo(repr(tools_config_from_options(kw).cors_proxy_allow))

    runner = CliRunner()
    r = runner.invoke(cmd, ["--cors-proxy-allow", "localhost:8080, 10.0.0.0/8"])
    assert r.exit_code == 0 and r.output.strip() == "('localhost:8080', '10.0.0.0/8')", r.output
    r = runner.invoke(cmd, [], env={"LLAMA_ARG_CORS_PROXY_ALLOW": "[::1]:3000"})
    assert r.exit_code == 0 and r.output.strip() == "('[::1]:3000',)", r.output
    r = runner.invoke(cmd, ["--cors-proxy-allow", "bad host"])
    assert r.exit_code == 2 and "--cors-proxy-allow: invalid entry 'bad host'" in r.output


def _allowed(allow: str, host: str, port: int, address: str) -> bool:
    policy = TargetPolicy(parse_allow_list(allow))
    try:
        policy.check(host, port, ipaddress.ip_address(address))
    except TargetRefused:
        return False
    return True


@pytest.mark.parametrize(
    ("allow", "host", "port", "address", "ok"),
    [
        ("", "93.184.216.34", 80, "93.184.216.34", True),  # public: no entry needed
        ("", "127.0.0.1", 8080, "127.0.0.1", False),
        ("127.0.0.1:8080", "127.0.0.1", 8080, "127.0.0.1", True),
        ("127.0.0.1:8080", "127.0.0.1", 8081, "127.0.0.1", False),  # another port
        ("127.0.0.1:8080", "127.0.0.2", 8080, "127.0.0.2", False),
        ("127.0.0.1", "2130706433", 9, "127.0.0.1", True),  # addresses match whatever the spelling
        ("127.0.0.1", "::ffff:127.0.0.1", 9, "::ffff:127.0.0.1", True),
        ("127.0.0.1", "::1", 9, "::1", False),
        ("127.0.0.0/8", "mcp.test", 9, "127.3.2.1", True),  # a network matches the resolved address
        ("10.0.0.0/8", "10.1.2.3", 443, "10.1.2.3", True),
        ("10.0.0.0/8:443", "10.1.2.3", 80, "10.1.2.3", False),
        ("[::1]:8080", "::1", 8080, "::1", True),
        ("fd00::/8", "fd00:ec2::254", 80, "fd00:ec2::254", True),
        ("fe80::/10", "fe80::1%25eth0", 80, "fe80::1%2", True),
        ("localhost", "localhost", 8080, "127.0.0.1", True),  # a name matches the name as written
        ("localhost", "LOCALHOST.", 8080, "::1", True),
        ("localhost", "127.0.0.1", 8080, "127.0.0.1", False),  # not the same spelling
        ("localhost:3000", "localhost", 3001, "127.0.0.1", False),
        ("mcp.internal", "evil.example", 80, "10.0.0.5", False),
    ],
)
def test_allow_list_matching(allow, host, port, address, ok):
    assert _allowed(allow, host, port, address) is ok


def test_any_forbidden_answer_refuses_the_name():
    """A name whose answers mix public and private addresses is refused, whichever comes first."""

    async def mixed(host: str, port: int) -> list[str]:
        return {"a.test": ["93.184.216.34", "127.0.0.1"], "b.test": ["10.0.0.1", "2606:4700::1111"]}[host]

    policy = TargetPolicy((), mixed)
    for host in ("a.test", "b.test"):
        with pytest.raises(TargetRefused, match="--cors-proxy-allow"):
            asyncio.run(policy.addresses(host, 80))


def test_literals_are_not_resolved():
    async def never(host: str, port: int) -> list[str]:
        raise AssertionError(f"resolved {host}")

    policy = TargetPolicy(parse_allow_list("127.0.0.0/8"), never)
    assert asyncio.run(policy.addresses("0x7f000001", 80)) == ["127.0.0.1"]
    assert asyncio.run(policy.addresses("::ffff:127.0.0.1", 80)) == ["::ffff:7f00:1"]
    with pytest.raises(TargetRefused):
        policy.check_literal("10.0.0.1", 80)
    policy.check_literal("mcp.test", 80)  # a name: checked once resolved
