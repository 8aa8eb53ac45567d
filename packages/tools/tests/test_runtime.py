"""Isolates: spec validation (option injection refused), the exact command lines, and no host fallback."""

from __future__ import annotations

import asyncio
import shutil

import pytest
from conftest import call
from llama_tools.builtin.io import IsolateIO, RuntimeSpecError, make_io
from llama_tools.runtime import ToolsRuntime, check_runtime_spec, spawn_argv

SSH = ["ssh", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
       "-o", "StrictHostKeyChecking=yes"]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fake:does-not-exist", "unknown tool runtime: fake:does-not-exist"),
        ("docker", "unknown tool runtime: docker"),
        ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target: -oProxyCommand=touch /tmp/pwned"),
        ("ssh:", "invalid ssh target: "),
        ("ssh:host;rm -rf /", "invalid ssh target: host;rm -rf /"),
        ("ssh:user@host\nx", "invalid ssh target: user@host\nx"),
        ("docker-container:--privileged", "invalid container id: --privileged"),
        ("podman-container:-v/:/host", "invalid container id: -v/:/host"),
        ("docker-container:", "invalid container id: "),
        ("docker-container:abc def", "invalid container id: abc def"),
        ("docker:busybox", "tool runtime must name a running container: docker:busybox"),
        ("podman:busybox", "tool runtime must name a running container: podman:busybox"),
    ],
)
def test_refused_specs(spec, message):
    with pytest.raises(RuntimeSpecError) as e:
        make_io(spec, "/tmp")
    assert str(e.value) == message


def test_command_lines():
    docker = make_io("docker-container:abc123", "/work")
    assert isinstance(docker, IsolateIO)
    assert docker.build_argv(["cat", "--", "/work/x"], False) == [
        "docker",
        "exec",
        "abc123",
        "cat",
        "--",
        "/work/x",
    ]
    assert docker.build_argv(["sh", "-c", "x"], True) == ["docker", "exec", "-i", "abc123", "sh", "-c", "x"]
    podman = make_io("podman-container:c.1_x", "")
    assert podman.build_argv(["pwd"], False) == ["podman", "exec", "c.1_x", "pwd"]
    ssh = make_io("ssh:user@build-host.example", "")
    # the remote shell re-parses the command: one quoted word, quotes escaped
    assert ssh.build_argv(["echo", "it's $HOME"], False) == [*SSH, "-n", "user@build-host.example",
                                                             "'echo' 'it'\\''s $HOME'"]  # fmt: skip
    assert ssh.build_argv(["cat"], True) == [*SSH, "user@build-host.example", "'cat'"]
    assert docker.resolve("rel/p") == "/work/rel/p" and docker.resolve("/abs") == "/abs"
    assert spawn_argv("docker", "busybox", "/tmp/c.cid") == [
        "docker", "run", "--rm", "-i", "--cidfile", "/tmp/c.cid", "busybox", "sh"
    ]  # fmt: skip


def test_missing_engine_is_an_error_not_the_host(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker, podman or ssh here
    marker = tmp_path / "ran"
    for spec in ("docker-container:abc", "podman-container:abc", "ssh:host"):
        with pytest.raises(RuntimeSpecError, match="is not installed"):
            call("exec_shell_command", {"command": f"touch {marker}"}, runtime=spec)
        with pytest.raises(RuntimeSpecError, match="is not installed"):
            call("read_file", {"path": "/etc/hostname"}, runtime=spec)
    assert not marker.exists()


def test_startup_validation(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    for spec, message in [
        ("docker:busybox", "docker is not installed"),
        ("podman-container:abc", "podman is not installed"),
        ("ssh:host", "ssh is not installed"),
        ("docker:--privileged", "invalid container image"),
        ("ssh:-oX", "invalid ssh target"),
        ("lxc:x", "unknown tool runtime"),
    ]:
        with pytest.raises(RuntimeSpecError, match=message):
            check_runtime_spec(spec)
    check_runtime_spec("")


def test_owned_container_uses_a_fake_engine(tmp_path, monkeypatch):
    """A stand-in `docker` on PATH (a script) shows the spawn and attach protocol without a daemon."""
    engine = tmp_path / "docker"
    log = tmp_path / "argv.log"
    engine.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'if [ "$1" = run ]; then echo cid123 > "$5"; exec cat >/dev/null; fi\n'
        'if [ "$1" = exec ]; then shift; shift; [ "$1" = cid123 ] && shift; exec "$@"; fi\n'
    )
    engine.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{'/usr/bin:/bin'}")
    assert shutil.which("docker") == str(engine)

    async def go():
        rt = ToolsRuntime("docker:busybox")
        spec = await rt.call_spec()
        assert spec == "docker-container:cid123"
        assert await rt.call_spec() == spec  # reused while it lives
        io = make_io(spec, "")
        res = await io.run(["echo", "inside"], 4096, 5)
        await rt.stop()
        return res

    res = asyncio.run(go())
    assert res.output == b"inside\n" and res.exit_code == 0
    lines = log.read_text().splitlines()
    assert lines[0].startswith("run --rm -i --cidfile ") and lines[0].endswith(" busybox sh")
    assert lines[1] == "exec -i cid123 timeout 5s echo inside"
