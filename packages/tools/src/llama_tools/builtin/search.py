"""`file_glob_search` and `grep_search` (streams-and-tools.md §2.4): glob rules, limits and footers."""

from __future__ import annotations

import asyncio
import functools
import re
import time
from typing import Any

from .base import Tool, opt, req
from .io import LIST_BUDGET_S, PathError, ToolsIO

__all__ = ["FILE_GLOB_SEARCH", "GREP_SEARCH", "glob_match", "path_glob_match"]

MAX_RESULTS = 100
GREP_FILE_MAX = 16 * 1024 * 1024  # larger files are not searched
_BINARY_PROBE = 8192


# glob tokens: a literal character, `?`, a class, `*` (a run without `/`), `**` (any run), `**/` (zero or
# more whole directories)
_LIT, _ONE, _CLASS, _STAR, _DSTAR, _DIRS = range(6)
Token = tuple[int, Any]


def _class(body: str) -> tuple[bool, tuple[tuple[str, str], ...]]:
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
    ranges = []
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            ranges.append((body[i], body[i + 2]))
            i += 3
        else:
            ranges.append((body[i], body[i]))
            i += 1
    return negate, tuple(ranges)


@functools.lru_cache(maxsize=256)
def _tokens(pattern: str) -> tuple[Token, ...]:
    out: list[Token] = []
    i, n = 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i):
            tok: Token = (_DIRS, None)
            i += 3
        elif pattern.startswith("**", i):
            tok = (_DSTAR, None)
            i += 2
        elif pattern[i] == "*":
            tok = (_STAR, None)
            i += 1
        elif pattern[i] == "?":
            tok = (_ONE, None)
            i += 1
        elif pattern[i] == "[" and (j := _class_end(pattern, i)) > 0:
            tok = (_CLASS, _class(pattern[i + 1 : j]))
            i = j + 1
        else:
            tok = (_LIT, pattern[i])
            i += 1
        if out and tok[0] in (_STAR, _DSTAR, _DIRS) and out[-1] == tok:
            continue  # `**/**/` is `**/`, `**` after `*`-runs adds nothing: keeps the automaton small
        out.append(tok)
    return tuple(out)


def _class_end(pattern: str, i: int) -> int:
    j = i + 1
    if j < len(pattern) and pattern[j] in "!^":
        j += 1
    if j < len(pattern) and pattern[j] in "]-":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 1
    return j if j < len(pattern) else -1


def _step(tok: Token, c: str) -> bool:
    kind, arg = tok
    if kind == _LIT:
        return bool(c == arg)
    if kind == _ONE:
        return c != "/"
    negate, ranges = arg
    return c != "/" and any(lo <= c <= hi for lo, hi in ranges) != negate


class _Glob:
    """A glob as a set-of-states automaton, its transitions memoised (a DFA built lazily): time linear in
    the text whatever the pattern, no backtracking."""

    _MEMO_MAX = 65536

    def __init__(self, pattern: str) -> None:
        self.toks = _tokens(pattern)
        self.n = len(self.toks)
        self.inside = self.n + 1  # state inside+i: within the directories of the `**/` at i
        self.start = self._close({0})
        self.memo: dict[tuple[frozenset[int], str], frozenset[int]] = {}

    def _close(self, states: set[int]) -> frozenset[int]:
        toks, n = self.toks, self.n
        stack = list(states)
        while stack:
            i = stack.pop()
            if i < n and toks[i][0] in (_STAR, _DSTAR, _DIRS) and i + 1 not in states:
                states.add(i + 1)
                stack.append(i + 1)
        return frozenset(states)

    def _next(self, states: frozenset[int], c: str) -> frozenset[int]:
        nxt: set[int] = set()
        for st in states:
            if st >= self.inside:  # any character stays inside; a `/` may also end the directories
                nxt.add(st)
                if c == "/":
                    nxt.add(st - self.inside + 1)
                continue
            if st == self.n:
                continue
            kind = self.toks[st][0]
            if kind == _STAR:
                if c != "/":
                    nxt.add(st)
            elif kind == _DSTAR:
                nxt.add(st)
            elif kind == _DIRS:
                nxt.add(self.inside + st)
                if c == "/":
                    nxt.add(st + 1)
            elif _step(self.toks[st], c):
                nxt.add(st + 1)
        return self._close(nxt)

    def match(self, text: str) -> bool:
        states = self.start
        memo = self.memo
        for c in text:
            key = (states, c)
            nxt = memo.get(key)
            if nxt is None:
                nxt = self._next(states, c)
                if len(memo) >= self._MEMO_MAX:
                    memo.clear()
                memo[key] = nxt
            if not nxt:
                return False
            states = nxt
        return self.n in states


@functools.lru_cache(maxsize=64)
def _glob(pattern: str) -> _Glob:
    return _Glob(pattern)


def glob_match(pattern: str, text: str) -> bool:
    """`*` any run without `/`, `**` anything, `**/` zero or more directories, `?` one character but `/`,
    `[...]` a class (`[!...]`/`[^...]` negated)."""
    return _glob(pattern).match(text)


def path_glob_match(pattern: str, rel: str) -> bool:
    """A pattern without `/` matches the base name at any depth; one with `/` matches the relative path,
    with `**/` prepended unless it starts with `**` or `/`."""
    if "/" not in pattern:
        return glob_match(pattern, rel.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith("**/") or pattern.startswith("/"):
        return glob_match(pattern, rel)
    return glob_match("**/" + pattern, rel)


def _selected(
    entries: list[tuple[str, bool]], include: str, exclude: str, deadline: float
) -> tuple[list[tuple[str, bool]], bool]:
    """The entries include/exclude select, and whether the time budget ran out before all were seen."""
    out: list[tuple[str, bool]] = []
    for k, e in enumerate(entries):
        if k % 256 == 0 and time.monotonic() >= deadline:
            return out, True
        if path_glob_match(include, e[0]) and not (exclude and path_glob_match(exclude, e[0])):
            out.append(e)
    return out, False


async def _file_glob_search(p: dict[str, Any], io: ToolsIO, _: Any) -> dict[str, Any]:
    path, kind = p["path"], p["type"]
    limit = p["limit"]
    if limit < 1:
        return {"error": f"invalid limit: {limit} (expected 1 or more)"}
    limit = min(limit, MAX_RESULTS)
    if kind not in ("file", "dir", "all"):
        return {"error": f'invalid type: {kind} (expected "file", "dir" or "all")'}
    base = io.resolve(path)
    deadline = time.monotonic() + LIST_BUDGET_S  # one budget for the walk and the matching
    listing = await io.list_entries(base, max(0, p["max_depth"]), kind)
    if listing.err:
        return {"error": f"{listing.err}: {path}"}
    # matching runs in a worker thread: a long listing must not hold the event loop
    matches, late = await asyncio.to_thread(_selected, listing.entries, p["include"], p["exclude"], deadline)
    shown = matches[:limit]
    text = "".join(f"{rel}{'/' if is_dir else ''}\n" for rel, is_dir in shown)
    text += f"\n---\nTotal matches: {len(matches)}\n"
    if len(matches) > len(shown):
        text += (
            f"[{len(shown)} results limit reached ({len(matches)} total matches). "
            "Refine the glob pattern to narrow the search.]\n"
        )
    if listing.truncated or late:
        text += "[results truncated: time budget or unreadable directory]\n"
    entries = [{"path": rel, "type": "dir" if is_dir else "file"} for rel, is_dir in shown]
    return {"plain_text_response": text, "entries": entries, "base": base}


def _regex(p: dict[str, Any]) -> re.Pattern[str] | str:
    source = re.escape(p["pattern"]) if p["literal"] else p["pattern"]
    try:
        return re.compile(source, re.IGNORECASE if p["ignore_case"] else 0)
    except (re.error, RecursionError, OverflowError) as e:
        return f"invalid regex: {e}"


def _grep_file(
    data: bytes, shown: str, pattern: re.Pattern[str], ctx: int, numbered: bool, room: int
) -> tuple[list[str], int, bool]:
    """The output lines and match count of one file (at most `room` matches), and whether the cap was hit."""
    lines = data.decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out: list[str] = []
    count = 0
    for i, line in enumerate(lines):
        if count >= room:
            return out, count, True
        if not pattern.search(line):
            continue
        lo, hi = (max(0, i - ctx), min(len(lines) - 1, i + ctx)) if ctx else (i, i)
        for j in range(lo, hi + 1):
            sep = ":" if j == i else "-"
            num = f"{j + 1}{sep}" if numbered else ""
            out.append(f"{shown}{sep}{num}{lines[j]}\n")
        if ctx:
            out.append("--\n")
        count += 1
    return out, count, False


async def _files_to_search(p: dict[str, Any], io: ToolsIO, deadline: float) -> list[tuple[str, str]] | str:
    path = p["path"]
    full = io.resolve(path)
    if await io.is_file(full):
        return [(full, path)]
    if not await io.is_dir(full):
        return f"path does not exist: {path}"
    listing = await io.list_entries(full, 0, "file")
    if listing.err:
        return f"{listing.err}: {path}"
    selected, _ = await asyncio.to_thread(_selected, listing.entries, p["include"], p["exclude"], deadline)
    return [(f"{full.rstrip('/')}/{rel}", rel) for rel, _ in selected]


async def _grep_search(p: dict[str, Any], io: ToolsIO, _: Any) -> dict[str, Any]:
    pattern = _regex(p)
    if isinstance(pattern, str):
        return {"error": pattern}
    deadline = time.monotonic() + LIST_BUDGET_S  # one budget for the walk, the selection and the search
    files = await _files_to_search(p, io, deadline)
    if isinstance(files, str):
        return {"error": files}
    ctx = max(0, p["context_lines"])
    numbered = p["return_line_numbers"] or ctx > 0
    out: list[str] = []
    total = 0
    limit_hit = False
    for full, shown in files:
        if limit_hit or time.monotonic() >= deadline:
            break
        try:
            data = await io.read_bytes(full, GREP_FILE_MAX)
        except PathError:  # a symbolic link out of the tools directory: not searched
            continue
        if data is None or b"\0" in data[:_BINARY_PROBE]:
            continue  # unreadable, too large or binary
        # the regex runs in a worker thread: the event loop keeps serving whatever the pattern costs
        found, count, limit_hit = await asyncio.to_thread(
            _grep_file, data, shown, pattern, ctx, numbered, MAX_RESULTS - total
        )
        out.extend(found)
        total += count
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
