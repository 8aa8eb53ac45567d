"""read_file, write_file and edit_file on temporary directories, hostile inputs included."""

from __future__ import annotations

import base64
import os

import pytest
from conftest import call
from llama_tools.builtin import ParamError
from llama_tools.builtin.files import READ_MAX, apply_edits, fuzzy_normalize


def test_read_file_lines_and_append_loc(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\nthree")
    assert call("read_file", {"path": "a.txt"}, cwd=str(tmp_path)) == {
        "plain_text_response": "one\ntwo\nthree\n"
    }
    res = call(
        "read_file", {"path": str(tmp_path / "a.txt"), "start_line": 2, "end_line": 3, "append_loc": True}
    )
    assert res["plain_text_response"] == "2\u2192two\n3\u2192three\n"


def test_read_file_too_large_needs_a_range(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("x" * 100 + "\n" + "y" * (READ_MAX + 10) + "\n")
    res = call("read_file", {"path": str(big)})
    size = big.stat().st_size
    assert res == {
        "error": f"file too large ({size} bytes, max 16384). Use start_line/end_line to read a portion."
    }
    assert call("read_file", {"path": str(big), "end_line": 1})["plain_text_response"] == "x" * 100 + "\n"
    # a range whose text is over 16 KiB is cut with the marker
    text = call("read_file", {"path": str(big), "end_line": 2})["plain_text_response"]
    assert text == "x" * 100 + "\n[output truncated]"


def test_read_file_errors_and_base64(tmp_path):
    assert call("read_file", {"path": str(tmp_path / "nope")}) == {
        "error": f"cannot stat file: {tmp_path}/nope"
    }
    blob = bytes(range(256)) * 3
    (tmp_path / "b.bin").write_bytes(blob)
    res = call("read_file", {"path": "b.bin", "resp_type": "base64"}, cwd=str(tmp_path))
    assert res == {"base64": base64.b64encode(blob).decode(), "size_bytes": len(blob)}
    # binary text is returned with U+FFFD, never an exception
    assert "\ufffd" in call("read_file", {"path": str(tmp_path / "b.bin")})["plain_text_response"]
    # a directory or a FIFO is not a file to read (the FIFO must not block)
    assert call("read_file", {"path": str(tmp_path)})["error"].startswith("failed to open file")
    os.mkfifo(tmp_path / "fifo")
    assert call("read_file", {"path": str(tmp_path / "fifo")})["error"].startswith("failed to open file")


def test_read_file_device_is_refused():
    assert "error" in call("read_file", {"path": "/dev/zero", "end_line": 1})


def test_read_file_param_errors():
    with pytest.raises(ParamError, match='missing required parameter "path"'):
        call("read_file", {})
    with pytest.raises(ParamError, match="must be of type string"):
        call("read_file", {"path": 7})
    with pytest.raises(ParamError):
        call("read_file", {"path": ["a"]})


def test_home_expansion_and_traversal(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "h.txt").write_text("home\n")
    assert call("read_file", {"path": "~/h.txt"})["plain_text_response"] == "home\n"
    sub = tmp_path / "sub"
    sub.mkdir()
    # `..` is resolved lexically against the cwd (absolute paths are allowed, as in llama.cpp)
    assert call("read_file", {"path": "../h.txt"}, cwd=str(sub))["plain_text_response"] == "home\n"
    assert call("read_file", {"path": "../../../../../../../../nope"}, cwd=str(sub))["error"].startswith(
        "cannot stat file: "
    )


def test_write_file(tmp_path):
    res = call("write_file", {"path": "d/e/f.txt", "content": "héllo"}, cwd=str(tmp_path))
    assert res == {"result": "file written successfully", "path": "d/e/f.txt", "bytes": 6}
    assert (tmp_path / "d/e/f.txt").read_text() == "héllo"
    (tmp_path / "file").write_text("x")
    assert call("write_file", {"path": str(tmp_path / "file" / "under"), "content": ""}) == {
        "error": f"failed to write file: {tmp_path}/file/under"
    }
    with pytest.raises(ParamError):
        call("write_file", {"path": "x"})


def _edit(path, edits):
    return call("edit_file", {"path": str(path), "edits": edits})


def test_edit_file_exact_and_errors(tmp_path):
    f = tmp_path / "t.log"
    f.write_text("line1\nline2\nline3\n")
    res = _edit(
        f,
        [
            {"old_text": "line2", "new_text": "line2-edited"},
            {"old_text": "line3\n", "new_text": "line3\nline4\n"},
        ],
    )
    assert res == {"result": "file edited successfully", "path": str(f), "edits_applied": 2}
    assert f.read_text() == "line1\nline2-edited\nline3\nline4\n"
    assert _edit(f, []) == {"error": '"edits" must be a non-empty array'}
    assert _edit(f, [{"old_text": "", "new_text": "x"}]) == {"error": "edits[0].old_text must not be empty"}
    assert _edit(f, [{"old_text": "nope", "new_text": "x"}]) == {
        "error": f"could not find edits[0].old_text in {f}, it must match the file's current content exactly"
    }
    assert _edit(f, [{"old_text": "line1", "new_text": "line1"}]) == {
        "error": "no changes made: the replacement(s) produced identical content"
    }
    f.write_text("dup\ndup\n")
    assert _edit(f, [{"old_text": "dup", "new_text": "x"}]) == {
        "error": f"found 2 occurrences of edits[0].old_text in {f}, it must be unique"
    }
    f.write_text("line1\nline2\n")
    assert _edit(
        f, [{"old_text": "line1\nline2", "new_text": "a"}, {"old_text": "line2", "new_text": "b"}]
    ) == {
        "error": f"edits[0] and edits[1] overlap in {f}; merge them into one edit or target disjoint regions"
    }
    with pytest.raises(ParamError):
        _edit(f, [{"old_text": "line1"}])
    with pytest.raises(ParamError):
        call("edit_file", {"path": str(f), "edits": "line1"})
    assert _edit(tmp_path / "missing", [{"old_text": "a", "new_text": "b"}]) == {
        "error": f"failed to open file: {tmp_path}/missing"
    }


def test_edit_file_fuzzy_keeps_unchanged_lines(tmp_path):
    f = tmp_path / "q.py"
    f.write_text("keep   \nsay(\u201chi\u201d)  \nalso keep\t\n")
    # the model writes ASCII quotes and no trailing spaces
    assert _edit(f, [{"old_text": 'say("hi")', "new_text": 'say("bye")'}])["edits_applied"] == 1
    assert f.read_text() == 'keep   \nsay("bye")\nalso keep\t\n'


def test_edit_uniqueness_counts_normalised_text():
    # a whitespace-only duplicate still counts
    assert "2 occurrences" in apply_edits("a = 1  \na = 1\n", [("a = 1", "b")], "p")["error"]
    assert fuzzy_normalize("x\u2014y\u00a0\u2019z  \r\nw") == "x-y 'z\nw"


def test_edit_preserves_undecodable_bytes(tmp_path):
    f = tmp_path / "bin.txt"
    f.write_bytes(b"\xff\xfe head\nvalue = 1\n")
    assert _edit(f, [{"old_text": "value = 1", "new_text": "value = 2"}])["edits_applied"] == 1
    assert f.read_bytes() == b"\xff\xfe head\nvalue = 2\n"
