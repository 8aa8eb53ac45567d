"""The tools directory (`--tools-dir`, default the working directory): host paths are resolved with their
symbolic links and `..` and refused outside it, nothing read or written there; commands start inside it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from litestar import Litestar
from litestar.testing import TestClient
from llama_tools import ToolsConfig, ToolsService, tools_config_from_options, tools_route_handlers
from llama_tools.config import BUILTIN_TOOL_NAMES

OUTSIDE = "path is outside the tools directory"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("confine")
    root, outside = base / "root", base / "root2"  # a sibling sharing the root's name as a prefix
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "a.txt").write_text("inside\n")
    (outside / "secret.txt").write_text("s3cr3t\n")
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "linkdir").symlink_to(outside)
    (root / "dangling").symlink_to(outside / "made-by-a-write.txt")
    return root, outside


@pytest.fixture(scope="module")
def client(dirs: tuple[Path, Path]) -> Iterator[TestClient]:
    service = ToolsService(ToolsConfig(tools=BUILTIN_TOOL_NAMES, root=str(dirs[0])))
    app = Litestar(route_handlers=tools_route_handlers(service), lifespan=[service.lifespan])
    with TestClient(app) as c:
        yield c


def call(c: TestClient, tool: str, params: dict, headers: dict | None = None) -> dict:
    r = c.post("/tools", json={"tool": tool, "params": params}, headers=headers or {})
    assert r.status_code == 200, r.text
    return r.json()


def test_inside_paths_work(client, dirs):
    root, _ = dirs
    for path in ("a.txt", str(root / "a.txt"), "sub/../a.txt", "./sub/../../root/a.txt"):
        assert call(client, "read_file", {"path": path}) == {"plain_text_response": "inside\n"}, path
    assert call(client, "write_file", {"path": "sub/new.txt", "content": "x"})["bytes"] == 1
    assert (root / "sub" / "new.txt").read_text() == "x"
    assert call(client, "read_file", {"path": "nope.txt"}) == {"error": "cannot stat file: nope.txt"}


@pytest.mark.parametrize(
    "path",
    ["../root2/secret.txt", "sub/../../root2/secret.txt", "link.txt", "linkdir/secret.txt", "/etc/hostname",
     "~/.bashrc", "a.txt\u0000"],
)  # fmt: skip
def test_reads_outside_are_refused(client, dirs, path, monkeypatch):
    _, outside = dirs
    if path.startswith("~"):
        monkeypatch.setenv("HOME", str(outside))
    res = call(client, "read_file", {"path": path})
    assert set(res) == {"error"} and ("outside" in res["error"] or "invalid path" in res["error"]), res
    assert "s3cr3t" not in json.dumps(res)
    assert call(client, "read_file", {"path": path}, {"x-resp-type": "base64"}).keys() == {"error"}


@pytest.mark.parametrize(
    "path", ["../root2/new.txt", "linkdir/new.txt", "dangling", "link.txt", str(Path("/tmp") / "conf-w.txt")]
)
def test_writes_outside_are_refused(client, dirs, path):
    _, outside = dirs
    before = sorted(p.name for p in outside.iterdir())
    res = call(client, "write_file", {"path": path, "content": "pwned"})
    assert res == {"error": f"{OUTSIDE}: {path}"}
    res = call(client, "edit_file", {"path": path, "edits": [{"old_text": "s3cr3t", "new_text": "pwned"}]})
    assert res == {"error": f"{OUTSIDE}: {path}"}
    assert sorted(p.name for p in outside.iterdir()) == before
    assert (outside / "secret.txt").read_text() == "s3cr3t\n"
    assert not Path("/tmp/conf-w.txt").exists()


def test_searches_stay_inside(client, dirs):
    root, outside = dirs
    for tool, extra in (("file_glob_search", {}), ("grep_search", {"pattern": "s"})):
        for path in (str(outside), "../root2", "linkdir"):
            assert call(client, tool, {"path": path, **extra}) == {"error": f"{OUTSIDE}: {path}"}
    # links out are listed by name but never followed: their content is not searched
    text = call(client, "grep_search", {"path": ".", "pattern": "s3cr3t|inside"})["plain_text_response"]
    assert "a.txt:inside" in text and "s3cr3t" not in text
    res = call(client, "file_glob_search", {"path": ".", "type": "all"})
    assert res["base"] == str(root) and "secret.txt" not in res["plain_text_response"]


def test_commands_run_in_the_tools_directory(client, dirs):
    root, outside = dirs
    assert call(client, "exec_shell_command", {"command": "pwd"})["plain_text_response"].startswith(
        f"{root}\n"
    )
    assert call(client, "get_info", {})["cwd"] == str(root)
    sub = call(client, "exec_shell_command", {"command": "pwd"}, {"x-tool-cwd": "sub"})
    assert sub["plain_text_response"].startswith(f"{root}/sub\n")
    # a working directory outside: nothing runs, every tool answers the error
    for cwd in (str(outside), "../root2", "linkdir"):
        h = {"x-tool-cwd": cwd}
        res = call(client, "exec_shell_command", {"command": "touch ran-outside"}, h)
        assert res == {"error": f"{OUTSIDE}: {cwd}"}
        assert call(client, "read_file", {"path": "secret.txt"}, h) == {"error": f"{OUTSIDE}: {cwd}"}
        body = {"tool": "exec_shell_command", "params": {"command": "touch ran-outside"}, "stream": True}
        with client.stream("POST", "/tools", json=body, headers=h) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert events == [{"done": True, "error": f"{OUTSIDE}: {cwd}"}]
    assert not (outside / "ran-outside").exists()


def test_default_is_the_working_directory(dirs, monkeypatch):
    root, _ = dirs
    monkeypatch.chdir(root / "sub")
    assert ToolsService(ToolsConfig(tools=("read_file",))).root == str(root / "sub")
    cfg = tools_config_from_options({"tools": "all"})
    assert cfg.root == str(root / "sub")
    assert tools_config_from_options({"tools": "all", "tools_dir": str(root / "linkdir")}).root == str(
        dirs[1]
    )  # resolved once at start-up
    with pytest.raises(click.UsageError, match="--tools-dir: not a directory"):
        tools_config_from_options({"tools": "all", "tools_dir": str(root / "a.txt")})


def test_slash_means_anywhere(dirs):
    _, outside = dirs
    service = ToolsService(ToolsConfig(tools=("read_file",), root="/"))
    app = Litestar(route_handlers=tools_route_handlers(service), lifespan=[service.lifespan])
    with TestClient(app) as c:
        res = call(c, "read_file", {"path": str(outside / "secret.txt")})
    assert res == {"plain_text_response": "s3cr3t\n"}
    assert os.path.realpath("/") == "/"
