"""`file_glob_search` and `grep_search` (streams-and-tools.md §2.4): glob rules, limits and footers."""

from __future__ import annotations

import functools
import re
import time
from typing import Any

from .base import Tool, opt, req
from .io import LIST_BUDGET_S, ToolsIO

__all__ = ["FILE_GLOB_SEARCH", "GREP_SEARCH", "glob_match", "path_glob_match"]

MAX_RESULTS = 100
GREP_FILE_MAX = 16 * 1024 * 1024  # larger files are not searched
_BINARY_PROBE = 8192


@functools.lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """`*` any run without `/`, `**` anything (and `**/` zero or more directories), `?` one character
    but `/`, `[...]` a class (`[!...]`/`[^...]` negated)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = i + 1
            if j < n and pattern[j] in "!^":
                j += 1
            if j < n and pattern[j] in "]-":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(re.escape("["))
                i += 1
                continue
            body = pattern[i + 1 : j]
            negate = body[:1] in ("!", "^")
            if negate:
                body = body[1:]
            body = body.replace("\\", "\\\\").replace("[", "\\[")
            out.append(f"[{'^' if negate else ''}{body}]")
            i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    try:
        return re.compile("".join(out), re.DOTALL)
    except re.error:  # a class such as [z-a]: match it literally
        return re.compile(re.escape(pattern))


def glob_match(pattern: str, text: str) -> bool:
    return _glob_regex(pattern).fullmatch(text) is not None


def path_glob_match(pattern: str, rel: str) -> bool:
    """A pattern without `/` matches the base name at any depth; one with `/` matches the relative path,
    with `**/` prepended unless it starts with `**` or `/`."""
    if "/" not in pattern:
        return glob_match(pattern, rel.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith("**/") or pattern.startswith("/"):
        return glob_match(pattern, rel)
    return glob_match("**/" + pattern, rel)


def _selected(entries: list[tuple[str, bool]], include: str, exclude: str) -> list[tuple[str, bool]]:
    return [
        e
        for e in entries
        if path_glob_match(include, e[0]) and not (exclude and path_glob_match(exclude, e[0]))
    ]


async def _file_glob_search(p: dict[str, Any], io: ToolsIO, _: Any) -> dict[str, Any]:
    path, kind = p["path"], p["type"]
    limit = p["limit"]
    if limit < 1:
        return {"error": f"invalid limit: {limit} (expected 1 or more)"}
    limit = min(limit, MAX_RESULTS)
    if kind not in ("file", "dir", "all"):
        return {"error": f'invalid type: {kind} (expected "file", "dir" or "all")'}
    base = io.resolve(path)
    listing = await io.list_entries(base, max(0, p["max_depth"]), kind)
    if listing.err:
        return {"error": f"{listing.err}: {path}"}
    matches = _selected(listing.entries, p["include"], p["exclude"])
    shown = matches[:limit]
    text = "".join(f"{rel}{'/' if is_dir else ''}\n" for rel, is_dir in shown)
    text += f"\n---\nTotal matches: {len(matches)}\n"
    if len(matches) > len(shown):
        text += (
            f"[{len(shown)} results limit reached ({len(matches)} total matches). "
            "Refine the glob pattern to narrow the search.]\n"
        )
    if listing.truncated:
        text += "[results truncated: time budget or unreadable directory]\n"
    entries = [{"path": rel, "type": "dir" if is_dir else "file"} for rel, is_dir in shown]
    return {"plain_text_response": text, "entries": entries, "base": base}


def _regex(p: dict[str, Any]) -> re.Pattern[str] | str:
    source = re.escape(p["pattern"]) if p["literal"] else p["pattern"]
    try:
        return re.compile(source, re.IGNORECASE if p["ignore_case"] else 0)
    except (re.error, RecursionError, OverflowError) as e:
        return f"invalid regex: {e}"


async def _files_to_search(p: dict[str, Any], io: ToolsIO) -> list[tuple[str, str]] | str:
    path = p["path"]
    full = io.resolve(path)
    if await io.is_file(full):
        return [(full, path)]
    if not await io.is_dir(full):
        return f"path does not exist: {path}"
    listing = await io.list_entries(full, 0, "file")
    if listing.err:
        return f"{listing.err}: {path}"
    return [
        (f"{full.rstrip('/')}/{rel}", rel)
        for rel, _ in _selected(listing.entries, p["include"], p["exclude"])
    ]


async def _grep_search(p: dict[str, Any], io: ToolsIO, _: Any) -> dict[str, Any]:
    pattern = _regex(p)
    if isinstance(pattern, str):
        return {"error": pattern}
    files = await _files_to_search(p, io)
    if isinstance(files, str):
        return {"error": files}
    ctx = max(0, p["context_lines"])
    numbered = p["return_line_numbers"] or ctx > 0
    out: list[str] = []
    total = 0
    limit_hit = False
    deadline = time.monotonic() + LIST_BUDGET_S
    for full, shown in files:
        if limit_hit or time.monotonic() >= deadline:
            break
        data = await io.read_bytes(full, GREP_FILE_MAX)
        if data is None or b"\0" in data[:_BINARY_PROBE]:
            continue  # unreadable, too large or binary
        lines = data.decode("utf-8", "replace").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for i, line in enumerate(lines):
            if total >= MAX_RESULTS:
                limit_hit = True
                break
            if not pattern.search(line):
                continue
            lo, hi = (max(0, i - ctx), min(len(lines) - 1, i + ctx)) if ctx else (i, i)
            for j in range(lo, hi + 1):
                sep = ":" if j == i else "-"
                num = f"{j + 1}{sep}" if numbered else ""
                out.append(f"{shown}{sep}{num}{lines[j]}\n")
            if ctx:
                out.append("--\n")
            total += 1
    text = "".join(out) + f"\n---\nTotal matches: {total}\n"
    if limit_hit:
        text += f"[{MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]\n"
    return {"plain_text_response": text}


FILE_GLOB_SEARCH = Tool(
    name="file_glob_search",
    display_name="File search",
    description="Find files (or directories) under a base directory whose paths match a glob pattern. "
    "Automatically skips files ignored by .gitignore (when the directory is inside a git repo) and never "
    "descends into dependency/build directories. include/exclude: a pattern with no '/' matches the basename "
    "at any depth; a pattern with '/' matches the relative path. Note: directory listings do not apply "
    ".gitignore filtering.",
    params=(
        req("path", "string", "Base directory to search in"),
        opt("include", "string", "Glob pattern for files to include (default: **)", "**"),
        opt("exclude", "string", "Glob pattern for files to exclude", ""),
        opt("type", "string", 'What to list: "file" (default), "dir" or "all"', "file"),
        opt("max_depth", "integer", "Maximum depth (0 = unlimited, 1 = direct children only)", 0),
        opt(
            "limit", "integer", f"Maximum number of results (default and maximum: {MAX_RESULTS})", MAX_RESULTS
        ),
    ),
    run=_file_glob_search,
)

GREP_SEARCH = Tool(
    name="grep_search",
    display_name="Grep search",
    description="Search for a regex pattern in a file or in the files under a directory. Automatically skips "
    "files ignored by .gitignore (when the directory is inside a git repo). include/exclude: a pattern with no "
    "'/' matches the basename at any depth; a pattern with '/' matches the relative path.",
    params=(
        req("path", "string", "File or directory to search in"),
        req("pattern", "string", "Regular expression to search for"),
        opt("include", "string", "Glob pattern for files to include (default: **)", "**"),
        opt("exclude", "string", "Glob pattern to exclude files", ""),
        opt("return_line_numbers", "boolean", "Prefix matches with their line numbers", False),
        opt("literal", "boolean", "Treat the pattern as literal text", False),
        opt("ignore_case", "boolean", "Case-insensitive search", False),
        opt("context_lines", "integer", "Lines of context around each match (default: 0)", 0),
    ),
    run=_grep_search,
)
