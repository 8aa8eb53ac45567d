"""file_glob_search and grep_search: glob rules, limits, junk directories, .gitignore, symlink loops."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from conftest import call
from llama_tools.builtin.search import glob_match, path_glob_match


def _tree(root):
    (root / "project-alpha" / "src").mkdir(parents=True)
    (root / "project-alpha" / "README.md").write_text("alpha")
    (root / "project-alpha" / "src" / "main.cpp").write_text("int main() {}\n")
    (root / "project-beta").mkdir()
    (root / "project-beta" / "notes.txt").write_text("beta\n")


def test_glob_rules():
    assert glob_match("*.py", "a.py") and not glob_match("*.py", "d/a.py")
    assert glob_match("**", "a/b/c") and glob_match("a/**/c", "a/c") and glob_match("a/**/c", "a/x/y/c")
    assert glob_match("file?.[ch]", "file1.c") and not glob_match("file?.[!ch]", "file1.c")
    assert path_glob_match("*.cpp", "deep/down/x.cpp")  # no slash: the base name at any depth
    assert path_glob_match("src/*.cpp", "src/main.cpp") and path_glob_match("src/*.cpp", "a/src/main.cpp")
    assert not path_glob_match("/src/*.cpp", "a/src/main.cpp")
    assert not glob_match("[z-a]", "q") and glob_match("[a", "[a")  # odd classes: no exception
    assert glob_match("*a*a*a*a*a*a*a*a*b", "a" * 60 + "b")
    assert not glob_match("[!a]b", "/b") and glob_match("[!a]b", "cb")


def test_glob_is_linear_on_hostile_patterns():
    start = time.monotonic()
    assert not glob_match("**/" * 500 + "*a*a*a*a*a*a*b", "a" * 200)
    assert not glob_match("*a" * 300 + "b", "a" * 300)
    assert time.monotonic() - start < 2


def test_glob_types_depth_and_limit(tmp_path):
    _tree(tmp_path)
    res = call("file_glob_search", {"path": str(tmp_path), "type": "dir"})
    assert {e["path"]: e["type"] for e in res["entries"]} == {
        "project-alpha": "dir",
        "project-alpha/src": "dir",
        "project-beta": "dir",
    }
    assert "project-alpha/\n" in res["plain_text_response"] and res["base"] == str(tmp_path)
    res = call("file_glob_search", {"path": str(tmp_path), "type": "all", "include": "*proj*"})
    assert {e["path"] for e in res["entries"]} == {"project-alpha", "project-beta"}
    res = call("file_glob_search", {"path": str(tmp_path), "max_depth": 2})
    assert {e["path"] for e in res["entries"]} == {"project-alpha/README.md", "project-beta/notes.txt"}
    res = call("file_glob_search", {"path": str(tmp_path), "limit": 1})
    assert len(res["entries"]) == 1
    assert res["plain_text_response"].endswith(
        "\n---\nTotal matches: 3\n[1 results limit reached (3 total matches). Refine the glob pattern to narrow"
        " the search.]\n"
    )
    res = call(
        "file_glob_search", {"path": ".", "include": "src/*.cpp", "exclude": "*.md"}, cwd=str(tmp_path)
    )
    assert res["plain_text_response"] == "project-alpha/src/main.cpp\n\n---\nTotal matches: 1\n"


def test_glob_errors(tmp_path):
    assert call("file_glob_search", {"path": str(tmp_path), "type": "bogus"}) == {
        "error": 'invalid type: bogus (expected "file", "dir" or "all")'
    }
    assert call("file_glob_search", {"path": str(tmp_path), "limit": 0}) == {
        "error": "invalid limit: 0 (expected 1 or more)"
    }
    assert call("file_glob_search", {"path": str(tmp_path / "none")}) == {
        "error": f"path does not exist or is not a directory: {tmp_path}/none"
    }
    # the result cap is 100 whatever the request says
    for i in range(120):
        (tmp_path / f"f{i}.txt").write_text("")
    assert len(call("file_glob_search", {"path": str(tmp_path), "limit": 10**9})["entries"]) == 100


def test_junk_dirs_listed_not_walked_and_symlink_loops(tmp_path):
    (tmp_path / "build" / "nested").mkdir(parents=True)
    (tmp_path / "build" / "artifact.txt").write_text("built")
    (tmp_path / "Node_Modules").mkdir()
    (tmp_path / "Node_Modules" / "dep.js").write_text("")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.cpp").write_text("")
    os.symlink(tmp_path, tmp_path / "src" / "loop")  # a link back to an ancestor
    outside = tmp_path.parent / (tmp_path.name + "-outside")
    outside.mkdir(exist_ok=True)
    (outside / "secret.txt").write_text("s")
    os.symlink(outside, tmp_path / "out")
    res = call("file_glob_search", {"path": str(tmp_path), "type": "dir", "max_depth": 1})
    assert {"build", "Node_Modules", "src", "out"} <= {e["path"] for e in res["entries"]}
    paths = {e["path"] for e in call("file_glob_search", {"path": str(tmp_path), "type": "all"})["entries"]}
    assert "src/main.cpp" in paths and "src/loop" in paths
    assert not any(p.startswith(("build/", "Node_Modules/", "src/loop/", "out/")) for p in paths)
    shutil.rmtree(outside)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is part of the test image")
def test_gitignore_inside_a_work_tree(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("*.log\n")
    (tmp_path / "keep.txt").write_text("needle\n")
    (tmp_path / "drop.log").write_text("needle\n")
    paths = {e["path"] for e in call("file_glob_search", {"path": str(tmp_path)})["entries"]}
    assert paths == {".gitignore", "keep.txt"}
    text = call("grep_search", {"path": str(tmp_path), "pattern": "needle"})["plain_text_response"]
    assert text == "keep.txt:needle\n\n---\nTotal matches: 1\n"


def test_grep_formats(tmp_path):
    (tmp_path / "a.txt").write_text("alpha\nbeta\ngamma\nBeta.x\n")
    base = {"path": str(tmp_path), "pattern": "beta"}
    assert call("grep_search", base)["plain_text_response"] == "a.txt:beta\n\n---\nTotal matches: 1\n"
    res = call("grep_search", {**base, "ignore_case": True, "return_line_numbers": True})
    assert res["plain_text_response"] == "a.txt:2:beta\na.txt:4:Beta.x\n\n---\nTotal matches: 2\n"
    res = call("grep_search", {**base, "context_lines": 1})
    assert (
        res["plain_text_response"]
        == "a.txt-1-alpha\na.txt:2:beta\na.txt-3-gamma\n--\n\n---\nTotal matches: 1\n"
    )
    res = call("grep_search", {"path": str(tmp_path / "a.txt"), "pattern": "a.x", "literal": True})
    assert res["plain_text_response"] == f"{tmp_path}/a.txt:Beta.x\n\n---\nTotal matches: 1\n"
    assert call("grep_search", {"path": str(tmp_path), "pattern": "("})["error"].startswith("invalid regex: ")
    assert call("grep_search", {"path": str(tmp_path / "x"), "pattern": "a"}) == {
        "error": f"path does not exist: {tmp_path}/x"
    }


def test_grep_limit_and_binary(tmp_path):
    (tmp_path / "many.txt").write_text("hit\n" * 150)
    (tmp_path / "blob.bin").write_bytes(b"hit\0\x01\x02" * 10)
    text = call("grep_search", {"path": str(tmp_path), "pattern": "hit"})["plain_text_response"]
    assert text.count("many.txt:hit\n") == 100 and "blob.bin" not in text
    assert text.endswith(
        "\n---\nTotal matches: 100\n[100 matches limit reached. Narrow the path/pattern/include to see more.]\n"
    )
