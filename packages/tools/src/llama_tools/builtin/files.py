"""`read_file`, `write_file` and `edit_file` (streams-and-tools.md §2.4)."""

from __future__ import annotations

import base64
import bisect
import itertools
import re
from typing import Any

from .base import ParamError, Tool, opt, req
from .io import ToolsIO

__all__ = ["EDIT_FILE", "READ_FILE", "WRITE_FILE", "apply_edits", "fuzzy_normalize"]

READ_MAX = 16 * 1024  # a whole-file read and the text returned
READ_MAX_BASE64 = 32 * 1024 * 1024
READ_MAX_RANGE = 64 * 1024 * 1024  # a file read for a line range is held in memory whole
EDIT_MAX = 64 * 1024 * 1024
TRUNCATED = "[output truncated]"


def _text(data: bytes) -> str:
    # surrogateescape: bytes that are not UTF-8 come back unchanged when the text is written again
    return data.decode("utf-8", "surrogateescape")


def _out(text: str) -> str:
    """Text for a JSON answer: undecodable bytes shown as U+FFFD."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


async def _read_file(p: dict[str, Any], io: ToolsIO, _: Any) -> dict[str, Any]:
    path = p["path"]
    size = await io.file_size(path)
    if size is None:
        return {"error": f"cannot stat file: {path}"}
    if p.get("resp_type") == "base64":
        if size > READ_MAX_BASE64:
            return {"error": f"file too large ({size} bytes, max {READ_MAX_BASE64})"}
        data = await io.read_bytes(path, READ_MAX_BASE64)
        if data is None:
            return {"error": f"failed to open file: {path}"}
        return {"base64": base64.b64encode(data).decode(), "size_bytes": len(data)}
    start, end = p["start_line"], p["end_line"]
    if size > READ_MAX and end == -1:
        return {
            "error": f"file too large ({size} bytes, max {READ_MAX}). Use start_line/end_line to read a portion."
        }
    if size > READ_MAX_RANGE:
        return {"error": f"file too large ({size} bytes, max {READ_MAX_RANGE})"}
    data = await io.read_bytes(path, READ_MAX_RANGE)
    if data is None:
        return {"error": f"failed to open file: {path}"}
    lines = _text(data).split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line does not start another
    out: list[str] = []
    used = 0
    for n, line in enumerate(lines, 1):
        if n < start:
            continue
        if end != -1 and n > end:
            break
        piece = _out(f"{n}\u2192{line}\n" if p["append_loc"] else line + "\n")
        used += len(piece.encode())
        if used > READ_MAX:
            out.append(TRUNCATED)
            break
        out.append(piece)
    return {"plain_text_response": "".join(out)}


async def _write_file(p: dict[str, Any], io: ToolsIO, _: Any) -> dict[str, Any]:
    data = p["content"].encode("utf-8", "surrogatepass")
    if not await io.write_bytes(p["path"], data):
        return {"error": f"failed to write file: {p['path']}"}
    return {"result": "file written successfully", "path": p["path"], "bytes": len(data)}


# typographic characters a model writes where the file has ASCII (edit_file's fuzzy match)
_FUZZY = str.maketrans(
    {
        **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
        **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
        **dict.fromkeys(
            "\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000", " "
        ),
    }
)
_TRAILING = re.compile(r"[ \t\r]+$", re.MULTILINE)


def fuzzy_normalize(text: str) -> str:
    """Trailing spaces/tabs/CR removed per line, typographic quotes, dashes and spaces mapped to ASCII;
    the number of lines is unchanged."""
    return _TRAILING.sub("", text.translate(_FUZZY))


def _line_starts(text: str) -> list[int]:
    starts = [0]
    starts.extend(m.end() for m in re.finditer("\n", text))
    return starts


def _lines_keep(text: str) -> list[str]:
    """Lines split on `\n` only, each with its newline."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _splice(text: str, reps: list[tuple[int, int, str]], offset: int = 0) -> str:
    for start, length, new in reversed(reps):
        s = start - offset
        text = text[:s] + new + text[s + length :]
    return text


def _splice_keeping_lines(original: str, base: str, reps: list[tuple[int, int, str]]) -> str:
    """Apply replacements found in the normalised `base`; lines no replacement touches come from
    `original` verbatim (so a fuzzy edit does not strip trailing spaces elsewhere in the file)."""
    orig_lines = _lines_keep(original)
    starts = _line_starts(base)
    ends = [*starts[1:], len(base)]
    groups: list[list[Any]] = []  # [first line, end line (exclusive), replacements]
    for rep in reps:
        first = bisect.bisect_right(starts, rep[0]) - 1
        last = first
        while last + 1 < len(ends) and ends[last] < rep[0] + rep[1]:
            last += 1
        if groups and first < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], last + 1)
            groups[-1][2].append(rep)
        else:
            groups.append([first, last + 1, [rep]])
    out: list[str] = []
    line = 0
    for first, end, group in groups:
        out.extend(orig_lines[line:first])
        lo, hi = starts[first], ends[end - 1]
        out.append(_splice(base[lo:hi], group, lo))
        line = end
    out.extend(orig_lines[line:])
    return "".join(out)


def apply_edits(original: str, edits: list[tuple[str, str]], path: str) -> str | dict[str, str]:
    """The new content, or `{"error": ...}`. Every `old_text` is matched against the original content:
    verbatim if every one is found, else all against the fuzzy-normalised text; uniqueness is always
    checked on normalised text."""
    norm_original = fuzzy_normalize(original)
    fuzzy = False
    for i, (old, _) in enumerate(edits):
        if old in original:
            continue
        if fuzzy_normalize(old) not in norm_original:
            return {
                "error": f"could not find edits[{i}].old_text in {path}, it must match the file's current "
                "content exactly"
            }
        fuzzy = True
    base = norm_original if fuzzy else original
    matched: list[tuple[int, int, str, int]] = []
    for i, (old, new) in enumerate(edits):
        norm_old = fuzzy_normalize(old)
        count = norm_original.count(norm_old)
        if count > 1:
            return {"error": f"found {count} occurrences of edits[{i}].old_text in {path}, it must be unique"}
        needle = norm_old if fuzzy else old
        matched.append((base.find(needle), len(needle), new, i))
    matched.sort()
    for a, b in itertools.pairwise(matched):
        if a[0] + a[1] > b[0]:
            return {
                "error": f"edits[{a[3]}] and edits[{b[3]}] overlap in {path}; merge them into one edit or "
                "target disjoint regions"
            }
    reps = [(s, n, new) for s, n, new, _ in matched]
    return _splice_keeping_lines(original, base, reps) if fuzzy else _splice(original, reps)


def _edit_list(raw: list[Any]) -> list[tuple[str, str]] | dict[str, str]:
    if not raw:
        return {"error": '"edits" must be a non-empty array'}
    edits = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict) or not isinstance(e.get("old_text"), str):
            raise ParamError(f"edits[{i}].old_text must be a string")
        if not isinstance(e.get("new_text"), str):
            raise ParamError(f"edits[{i}].new_text must be a string")
        if not e["old_text"]:
            return {"error": f"edits[{i}].old_text must not be empty"}
        edits.append((e["old_text"], e["new_text"]))
    return edits


async def _edit_file(p: dict[str, Any], io: ToolsIO, _: Any) -> dict[str, Any]:
    path = p["path"]
    edits = _edit_list(p["edits"])
    if isinstance(edits, dict):
        return edits
    data = await io.read_bytes(path, EDIT_MAX)
    if data is None:
        return {"error": f"failed to open file: {path}"}
    original = _text(data)
    result = apply_edits(original, edits, path)
    if isinstance(result, dict):
        return result
    if result == original:
        return {"error": "no changes made: the replacement(s) produced identical content"}
    if not await io.write_bytes(path, result.encode("utf-8", "surrogateescape")):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file edited successfully", "path": path, "edits_applied": len(edits)}


READ_FILE = Tool(
    name="read_file",
    display_name="Read file",
    description="Read the contents of a file. Optionally specify a 1-based line range. If append_loc is true, "
    'each line is prefixed with its line number (e.g. "1\u2192...").',
    params=(
        req("path", "string", "Path to the file"),
        opt("start_line", "integer", "First line to read, 1-based (default: 1)", 1),
        opt("end_line", "integer", "Last line to read, 1-based inclusive (default: end of file)", -1),
        opt("append_loc", "boolean", "Prefix each line with its line number", False),
    ),
    run=_read_file,
)

WRITE_FILE = Tool(
    name="write_file",
    display_name="Write file",
    description="Write content to a file, creating it (including parent directories) if it does not exist. "
    "May use with edit_file for more complex edits.",
    params=(req("path", "string", "Path of the file to write"), req("content", "string", "Content to write")),
    run=_write_file,
    write=True,
)

EDIT_FILE = Tool(
    name="edit_file",
    display_name="Edit file",
    description="Edit a file by replacing exact text. Each old_text must match the file's current content "
    "exactly once; all edits are matched against the original content and must not overlap.",
    params=(
        req("path", "string", "Path of the file to edit"),
        req(
            "edits",
            "array",
            "Replacements to apply",
            items={
                "type": "object",
                "properties": {
                    "old_text": {
                        "type": "string",
                        "description": "Text to find (must be unique in the file)",
                    },
                    "new_text": {"type": "string", "description": "Replacement text"},
                },
                "required": ["old_text", "new_text"],
            },
        ),
    ),
    run=_edit_file,
    write=True,
)
