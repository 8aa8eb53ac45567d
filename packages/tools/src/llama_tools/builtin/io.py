"""Where a tool's file and command operations happen: the host, or an isolate (streams-and-tools.md §2.5).

`HostIO` uses the local file system and runs commands directly. `IsolateIO` turns every operation into a
POSIX command run inside a container (`docker|podman exec <id>`) or on a remote host (`ssh <target>`):
file content travels on stdin, never on a command line, and the working directory is applied with
`cd "$1" || exit 127`. `make_io` validates a runtime spec and never falls back to the host.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from .process import ExecResult, run_process

__all__ = [
    "JUNK_DIR_NAMES",
    "LIST_BUDGET_S",
    "HostIO",
    "IsolateIO",
    "ListResult",
    "PathError",
    "RuntimeSpecError",
    "ToolsIO",
    "container_spec",
    "make_io",
]

# directories listed but never walked: they can be enormous (streams-and-tools.md §2.4)
JUNK_DIR_NAMES = frozenset(
    {
        ".git",
        ".svn",
        ".hg",
        "node_modules",
        "__pycache__",
        ".venv",
        "venv",
        "dist",
        "build",
        "target",
        ".cache",
        ".idea",
        ".vscode",
    }
)
LIST_BUDGET_S = 15.0  # the walk budget of file_glob_search / grep_search
_LIST_MAX_OUTPUT = 16 * 1024 * 1024  # bytes of `git ls-files` / `find` output read
_AUX_TIMEOUT = 15.0  # auxiliary isolate commands (stat, cat, mkdir)
_ISOLATE_READ_MAX = 64 * 1024 * 1024
_ENGINES = ("docker", "podman")
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SSH_TARGET_RE = re.compile(r"[A-Za-z0-9._@][A-Za-z0-9._@-]*")
_SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "-o",
                "KbdInteractiveAuthentication=no", "-o", "StrictHostKeyChecking=yes")  # fmt: skip

Chunk = Callable[[str], Awaitable[None]]


class RuntimeSpecError(RuntimeError):
    """A runtime spec that cannot be used; `POST /tools` answers it with 500 and this message."""


class PathError(Exception):
    """A path the tool may not touch (outside the tools directory, or not a path at all): the call answers
    `{"error": message}` and reads or writes nothing."""


def inside(path: str, root: str) -> bool:
    """Whether the absolute `path` is `root` or below it (both already resolved)."""
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


class ListResult(msgspec.Struct):
    """Entries below a base directory: `(relative path with /, is_dir)`; `truncated` when the walk budget
    ran out or a directory could not be read; `err` when the base is not a directory."""

    entries: list[tuple[str, bool]] = []
    truncated: bool = False
    err: str | None = None


def _depth(rel: str) -> int:
    return rel.count("/") + 1


class ToolsIO:
    """The operations the built-in tools need, relative paths resolved against `cwd`."""

    isolated = False

    def __init__(self, cwd: str = "") -> None:
        self.cwd = cwd

    def resolve(self, path: str) -> str:
        raise NotImplementedError

    def workdir(self) -> str:
        """Where relative paths and commands start."""
        return self.cwd or os.getcwd()

    async def is_dir(self, path: str) -> bool:
        raise NotImplementedError

    async def is_file(self, path: str) -> bool:
        raise NotImplementedError

    async def file_size(self, path: str) -> int | None:
        raise NotImplementedError

    async def read_bytes(self, path: str, limit: int) -> bytes | None:
        """The file's bytes (None when it cannot be read or holds more than `limit`)."""
        raise NotImplementedError

    async def write_bytes(self, path: str, data: bytes) -> bool:
        raise NotImplementedError

    async def list_entries(self, base: str, max_depth: int, kind: str) -> ListResult:
        """`kind`: `file`, `dir` or `all`; `max_depth` 0 = unlimited, 1 = direct children."""
        raise NotImplementedError

    async def run(
        self, argv: Sequence[str], max_output: int, timeout: float, on_chunk: Chunk | None = None
    ) -> ExecResult:
        raise NotImplementedError


class HostIO(ToolsIO):
    """The server's own machine. With `root` (the tools directory, resolved) every path is resolved with
    its symbolic links and `..` and refused unless it stays inside; relative paths and commands start
    from `cwd`, which must be inside too (default: `root`)."""

    def __init__(self, cwd: str = "", root: str = "") -> None:
        super().__init__(cwd)
        self.root = root

    def _absolute(self, path: str, base: str) -> str:
        if path == "~" or path.startswith("~/"):
            path = os.path.expanduser("~") + path[1:]
        if not os.path.isabs(path):
            path = os.path.join(base, path)
        return os.path.normpath(path).replace(os.sep, "/")

    def _confined(self, path: str, shown: str) -> str:
        # realpath resolves every symbolic link of the existing part (a link out is caught here) and
        # `..` after it; the IO then uses this resolved path, not the one given
        try:
            real = os.path.realpath(path).replace(os.sep, "/")
        except (OSError, ValueError):
            raise PathError(f"invalid path: {shown}") from None
        if not inside(real, self.root):
            raise PathError(f"path is outside the tools directory: {shown}")
        return real

    def workdir(self) -> str:
        """Where relative paths and commands start: `cwd` (checked), else the tools directory."""
        if not self.root:
            return self.cwd or os.getcwd()
        if not self.cwd:
            return self.root
        return self._confined(self._absolute(self.cwd, self.root), self.cwd)

    def resolve(self, path: str) -> str:
        """The absolute path of `path`; raises PathError when it leaves the tools directory."""
        full = self._absolute(path, self.workdir())
        return self._confined(full, path) if self.root else full

    async def is_dir(self, path: str) -> bool:
        return os.path.isdir(self.resolve(path))

    async def is_file(self, path: str) -> bool:
        return os.path.isfile(self.resolve(path))

    async def file_size(self, path: str) -> int | None:
        try:
            return os.stat(self.resolve(path)).st_size
        except (OSError, ValueError):
            return None

    async def read_bytes(self, path: str, limit: int) -> bytes | None:
        return await asyncio.to_thread(_read_regular, self.resolve(path), limit)

    async def write_bytes(self, path: str, data: bytes) -> bool:
        return await asyncio.to_thread(_write, self.resolve(path), data)

    async def list_entries(self, base: str, max_depth: int, kind: str) -> ListResult:
        root = self.resolve(base)
        if not os.path.isdir(root):
            return ListResult(err="path does not exist or is not a directory")
        if kind == "file" and shutil.which("git"):
            res = await run_process(
                ["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
                max_output=_LIST_MAX_OUTPUT,
                timeout=LIST_BUDGET_S,
            )
            if res.exit_code == 0 and not res.timed_out and not res.truncated:
                return await asyncio.to_thread(_git_entries, root, res.output, max_depth)
        deadline = time.monotonic() + LIST_BUDGET_S
        return await asyncio.to_thread(_walk, root, max_depth, kind, deadline)

    async def run(
        self, argv: Sequence[str], max_output: int, timeout: float, on_chunk: Chunk | None = None
    ) -> ExecResult:
        cwd = self.workdir() if self.root else self.cwd
        return await run_process(argv, max_output=max_output, timeout=timeout, cwd=cwd, on_chunk=on_chunk)


def _read_regular(path: str, limit: int) -> bytes | None:
    # only regular files: a FIFO or a device (/dev/zero) would block or never end
    try:
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except (OSError, ValueError):
        return None
    return data if len(data) <= limit else None


def _write(path: str, data: bytes) -> bool:
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    except (OSError, ValueError):
        return False
    return True


def _git_entries(root: str, output: bytes, max_depth: int) -> ListResult:
    out = ListResult()
    for line in output.decode("utf-8", "replace").splitlines():
        rel = line.strip("\r").replace("\\", "/")
        if not rel or (max_depth > 0 and _depth(rel) > max_depth):
            continue
        if os.path.isfile(os.path.join(root, rel)):
            out.entries.append((rel, False))
    return out


def _walk(root: str, max_depth: int, kind: str, deadline: float) -> ListResult:
    """Depth-first listing; symlinked directories are listed but never walked (a link to an ancestor
    would loop), junk directories likewise."""
    out = ListResult()
    stack: list[tuple[str, str, int]] = [(root, "", 0)]
    while stack:
        path, rel_dir, depth = stack.pop()
        try:
            with os.scandir(path) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError:
            out.truncated = True
            continue
        for entry in children:
            if time.monotonic() >= deadline:
                out.truncated = True
                return out
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                is_dir = entry.is_dir()
                is_file = not is_dir and entry.is_file()
                is_link = entry.is_symlink()
            except OSError:
                continue
            if is_dir:
                if kind in ("dir", "all"):
                    out.entries.append((rel, True))
                if entry.name.lower() in JUNK_DIR_NAMES or is_link:
                    continue
                if max_depth == 0 or depth + 1 < max_depth:
                    stack.append((entry.path, rel, depth + 1))
            elif is_file and kind in ("file", "all"):
                out.entries.append((rel, False))
    return out


def _quote_join(argv: Sequence[str]) -> str:
    """One word a POSIX shell re-parses into exactly `argv` (ssh sends its command as a string)."""
    return " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)


class IsolateIO(ToolsIO):
    """A container (`<engine> exec [-i] <id> ...`) or a remote host (`ssh ... <target> '<cmd>'`), driven
    only through POSIX commands (sh, cat, wc, mkdir, dirname, find, timeout)."""

    isolated = True

    def __init__(self, kind: str, target: str, cwd: str = "") -> None:
        super().__init__(cwd)
        self.kind = kind  # docker, podman or ssh
        self.target = target

    def build_argv(self, inner: Sequence[str], needs_stdin: bool) -> list[str]:
        """The host-side command line that runs `inner` (a complete argv) in the isolate."""
        if self.kind == "ssh":
            return ["ssh", *_SSH_OPTIONS, *([] if needs_stdin else ["-n"]), self.target, _quote_join(inner)]
        return [self.kind, "exec", *(["-i"] if needs_stdin else []), self.target, *inner]

    def resolve(self, path: str) -> str:
        if not self.cwd or path.startswith("/"):
            return path
        return self.cwd.rstrip("/") + "/" + path

    async def _exec(self, inner: Sequence[str], max_output: int = 4096, *, stdin: bytes | None = None,
                    combine: bool = True) -> ExecResult:  # fmt: skip
        return await _run_isolate(self.build_argv(inner, stdin is not None), max_output, _AUX_TIMEOUT,
                                  stdin=stdin, combine=combine)  # fmt: skip

    async def _test(self, flag: str, path: str) -> bool:
        res = await self._exec(["sh", "-c", f'[ {flag} "$1" ]', "_", self.resolve(path)])
        return res.exit_code == 0 and not res.timed_out

    async def is_dir(self, path: str) -> bool:
        return await self._test("-d", path)

    async def is_file(self, path: str) -> bool:
        return await self._test("-f", path)

    async def file_size(self, path: str) -> int | None:
        res = await self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64)
        try:
            return int(res.output.strip()) if res.exit_code == 0 and not res.timed_out else None
        except ValueError:
            return None

    async def read_bytes(self, path: str, limit: int) -> bytes | None:
        # stderr is not merged: it must not be spliced into the file's bytes
        res = await self._exec(
            ["cat", "--", self.resolve(path)], min(limit, _ISOLATE_READ_MAX) + 1, combine=False
        )
        if res.exit_code != 0 or res.timed_out or res.truncated:
            return None
        return res.output

    async def write_bytes(self, path: str, data: bytes) -> bool:
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
        res = await self._exec(["sh", "-c", script, "_", self.resolve(path)], stdin=data)
        return res.exit_code == 0 and not res.timed_out

    async def list_entries(self, base: str, max_depth: int, kind: str) -> ListResult:
        root = self.resolve(base)
        if not await self.is_dir(base):
            return ListResult(err="path does not exist or is not a directory")
        out = ListResult()
        if kind == "file":
            res = await self._exec(["sh", "-c", 'cd "$1" && git ls-files --cached --others --exclude-standard',
                                    "_", root], _LIST_MAX_OUTPUT)  # fmt: skip
            if res.exit_code == 0 and not res.timed_out:
                for rel in _lines(res.output):
                    if max_depth <= 0 or _depth(rel) <= max_depth:
                        out.entries.append((rel, False))
                return out
        for dirs in (True,) if kind == "dir" else (False,) if kind == "file" else (True, False):
            res = await self._exec(["sh", "-c", _find_script(max_depth, dirs), "_", root], _LIST_MAX_OUTPUT)
            out.truncated |= res.timed_out
            out.entries.extend((rel, dirs) for rel in _lines(res.output))
        return out

    async def run(
        self, argv: Sequence[str], max_output: int, timeout: float, on_chunk: Chunk | None = None
    ) -> ExecResult:
        # an in-isolate `timeout`: killing the host-side client does not kill the command over there
        inner: list[str] = ["timeout", f"{int(timeout)}s", *argv]
        if self.cwd:
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return await _run_isolate(self.build_argv(inner, True), max_output, timeout + 5, on_chunk=on_chunk,
                                  stdin=b"")  # fmt: skip


async def _run_isolate(argv: list[str], max_output: int, timeout: float, *, on_chunk: Chunk | None = None,
                       stdin: bytes | None = None, combine: bool = True) -> ExecResult:  # fmt: skip
    if shutil.which(argv[0]) is None:  # a clear error, never the host instead
        raise RuntimeSpecError(f"tool runtime unavailable: {argv[0]} is not installed")
    return await run_process(argv, max_output=max_output, timeout=timeout, stdin_data=stdin,
                             on_chunk=on_chunk, combine_stderr=combine)  # fmt: skip


def _lines(output: bytes) -> list[str]:
    out = []
    for line in output.decode("utf-8", "replace").splitlines():
        line = line.strip("\r").replace("\\", "/")
        if line.startswith("./"):
            line = line[2:]
        if line:
            out.append(line)
    return out


def _find_script(max_depth: int, dirs: bool) -> str:
    # one `find` pass; junk directories stay listed but are pruned (works with busybox and GNU find)
    prune = " -o ".join(f"-name {n}" for n in sorted(JUNK_DIR_NAMES))
    depth = f" -maxdepth {max_depth}" if max_depth > 0 else ""
    tail = " -print -o -type d -print" if dirs else " -o -type f -print"
    return f'cd "$1" && find . -mindepth 1{depth} \\( {prune} \\) -prune{tail}'


def container_spec(spec: str) -> tuple[str, str, bool] | None:
    """`docker:<image>` / `docker-container:<id>` (podman alike) as (engine, image or id, attach)."""
    for engine in _ENGINES:
        if spec.startswith(engine + "-container:"):
            return engine, spec[len(engine) + 11 :], True
        if spec.startswith(engine + ":"):
            return engine, spec[len(engine) + 1 :], False
    return None


def valid_container_id(cid: str) -> bool:
    """An id that cannot be read as an option of `<engine> exec` (e.g. `--privileged`)."""
    return _ID_RE.fullmatch(cid) is not None


def make_io(runtime: str, cwd: str, spawned_id: str | None = None, root: str = "") -> ToolsIO:
    """The IO for one call. `runtime`: the `x-tool-runtime` header or `--tools-runtime`; `spawned_id`: the
    container `--tools-runtime docker:<image>` started; `root`: the resolved tools directory the host's
    paths are confined to ("" = none; an isolate is its own confinement). Raises RuntimeSpecError; never
    the host for a runtime that was asked for."""
    if not runtime:
        return HostIO(cwd, root)
    container = container_spec(runtime)
    if container is not None:
        engine, arg, attach = container
        if not attach:
            if spawned_id is None:
                raise RuntimeSpecError(f"tool runtime must name a running container: {runtime}")
            arg = spawned_id
        if not valid_container_id(arg):
            raise RuntimeSpecError(f"invalid container id: {arg}")
        return IsolateIO(engine, arg, cwd)
    if runtime.startswith("ssh:"):
        target = runtime[4:]
        if _SSH_TARGET_RE.fullmatch(target) is None or target.startswith("-"):
            raise RuntimeSpecError(f"invalid ssh target: {target}")
        return IsolateIO("ssh", target, cwd)
    raise RuntimeSpecError(f"unknown tool runtime: {runtime}")
