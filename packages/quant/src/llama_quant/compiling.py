"""Compiling the numba kernels: where their cache lives, what is compiling, and compiling ahead in parallel.

numba compiles a kernel the first time it is called with new argument types and keeps the machine code in
an on-disk cache, so only a first start pays. Three things here make that first start bearable:

- ``configure_cache()`` puts the cache where a user's caches live (``$NUMBA_CACHE_DIR`` if set, else a
  folder under ``$XDG_CACHE_HOME/llama-py/numba`` or ``~/.cache/llama-py/numba``) instead of
  ``__pycache__`` folders inside site-packages. ``llama_quant`` calls it on import, before any
  ``@njit(cache=True)`` decoration reads the setting. numba checks a cached kernel against its own source
  file only, not against the files of the kernels it calls (which it compiled into it): edit a helper in
  one module and the cached callers in other modules would keep the old code. So the default folder is
  named after the sources of the packages with kernels (each file's size and modification time): any
  change to them starts a fresh cache, and the few most recent caches are kept. Several installs on one
  machine share that parent folder: every process holds a shared lock on an in-use file in the cache it
  uses, for its lifetime, and an older cache is removed only when nobody holds it and it has gone unused
  for a day, so one install never removes a cache another is compiling into.
- ``CompileWatch`` listens to numba's compile events and reports each kernel it compiles (name, seconds).
- ``precompile(jobs)`` runs warm-up jobs in child processes at once: numba compiles under one global lock
  per process, so two processes are the only way to use two cores. The children write into the shared
  cache; the caller then loads from it. ``shared_compiles()`` (active in every child) lets only one process
  at a time compile a given function, so two jobs that need the same kernel compile it once.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from numba.core import config as _numba_config
from numba.core import event as _event

__all__ = [
    "CacheMiss",
    "CompileJob",
    "CompileWatch",
    "cached_only",
    "code_size",
    "compile_kernel",
    "configure_cache",
    "default_cache_dir",
    "plan_compiles",
    "precompile",
    "prune_caches",
    "shared_compiles",
    "sources_digest",
]

log = logging.getLogger("llama_quant.compiling")

_CACHE_ENV = "NUMBA_CACHE_DIR"


_KERNEL_PACKAGES = ("llama_quant", "llama_engine")  # the packages whose modules hold numba kernels
_LEGACY_CACHE = re.compile(r"\w+_[0-9a-f]{40}")
_KEPT_CACHES = 3  # source versions whose caches stay (a few venvs or checkouts side by side)
_PRUNE_IDLE = 24 * 3600.0  # seconds a cache beyond those stays after its last use
_IN_USE = "in-use.lock"  # in each cache folder: shared-locked by every process using the folder
_held: dict[str, int] = {}  # cache folder -> the descriptor holding its in-use lock (for this process's life)


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/llama-py/numba``, or ``~/.cache/llama-py/numba`` when XDG_CACHE_HOME is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llama-py" / "numba"


def sources_digest() -> str:
    """A digest of the kernel packages' Python sources (path, size, modification time of each file)."""
    h = hashlib.sha1()
    for name in _KERNEL_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for root in (spec.submodule_search_locations or []) if spec is not None else []:
            for f in sorted(Path(root).rglob("*.py")):
                st = f.stat()
                h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _hold(folder: Path) -> int | None:
    """Take a shared lock on ``folder``'s in-use file for the life of this process (``prune_caches`` leaves
    a folder alone while anyone holds it) and mark the folder used now; the file descriptor, or None."""
    lock = folder / _IN_USE
    for _ in range(8):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a pruner decides about this folder
            held, there = os.fstat(fd), os.stat(lock)
            if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
                os.utime(folder)
                return fd
        except OSError:  # pruned between the open and the lock: make it again
            pass
        os.close(fd)
    return None


def _remove_if_idle(folder: Path, used_before: float) -> bool:
    """Remove ``folder`` if no process holds its in-use lock and it was last used before ``used_before``
    (a Unix time). The exclusive lock is held while it is removed, so a process that starts using the
    folder meanwhile waits, sees its lock file gone and makes the folder again."""
    try:
        last_used = folder.stat().st_mtime  # before the lock file is made, which would touch the folder
        fd = os.open(folder / _IN_USE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # in use
        os.close(fd)
        return False
    try:
        if last_used >= used_before:
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return not folder.exists()
    finally:
        os.close(fd)


def prune_caches(
    base: Path, current: Path, keep: int = _KEPT_CACHES, idle_seconds: float = _PRUNE_IDLE
) -> list[Path]:
    """Remove the source-version caches under ``base`` beyond the ``keep`` most recently used (``current``
    counts as one), and what earlier versions kept in ``base`` itself (numba's ``<module>_<40 hex digits>``
    folders); returns what was removed. Several installs share ``base``, so a folder goes only when no
    process holds its in-use lock (every process using a cache holds it for its lifetime) and it has not
    been used for ``idle_seconds``."""
    try:
        olds = sorted(
            (p for p in base.glob("src-*") if p.is_dir() and p != current),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        legacy = [p for p in base.iterdir() if p.is_dir() and _LEGACY_CACHE.fullmatch(p.name)]
    except OSError:
        return []
    used_before = time.time() - idle_seconds
    return [old for old in [*olds[max(keep - 1, 0) :], *legacy] if _remove_if_idle(old, used_before)]


def configure_cache() -> Path | None:
    """Point numba's kernel cache at ``$NUMBA_CACHE_DIR``, else at ``default_cache_dir()/src-<digest>``
    (``sources_digest()``, pruning older source versions); returns it.

    Also sets NUMBA_CACHE_DIR in the environment so child processes agree. Functions decorated before this
    call keep the location they were given. Returns None (numba's own default stays) when the directory
    cannot be created or written, e.g. a read-only home.
    """
    chosen = os.environ.get(_CACHE_ENV)
    path = Path(chosen) if chosen else default_cache_dir() / f"src-{sources_digest()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            return None
    except OSError:
        return None
    if str(path) not in _held:
        fd = _hold(path)
        if fd is not None:
            _held[str(path)] = fd
    if not chosen:
        prune_caches(path.parent, path)
    os.environ[_CACHE_ENV] = str(path)
    # numba read the environment when it was imported
    _numba_config.CACHE_DIR = str(path)  # type: ignore[attr-defined]
    return path


def _cache_dir() -> str:
    """numba's cache directory now ("" for its default, __pycache__ beside each source file)."""
    return str(getattr(_numba_config, "CACHE_DIR", ""))


def _kernel_name(dispatcher: Any) -> str:
    fn = dispatcher.py_func
    return f"{fn.__module__}.{fn.__qualname__}"


class CompileWatch(_event.Listener):
    """Counts the kernels numba compiles (cache misses only; loads from the cache are not events) and calls
    ``on_compiled(name, seconds)`` for each one called from Python. Kernels compiled because such a kernel
    calls them count within it. Use as a context manager; numba emits the events under its compiler lock,
    so one watch sees a whole process."""

    def __init__(self, on_compiled: Callable[[str, float], None] | None = None) -> None:
        self.on_compiled = on_compiled
        self.compiled: list[tuple[str, float]] = []
        self._open: list[float] = []

    def on_start(self, event: _event.Event) -> None:
        self._open.append(time.perf_counter())

    def on_end(self, event: _event.Event) -> None:
        if not self._open:  # a listener registered earlier stopped this compile from starting
            return
        seconds = time.perf_counter() - self._open.pop()
        if self._open:  # a callee of a kernel being compiled
            return
        name = _kernel_name(event.data["dispatcher"])
        self.compiled.append((name, seconds))
        if self.on_compiled is not None:
            self.on_compiled(name, seconds)

    def __enter__(self) -> CompileWatch:
        _event.register("numba:compile", self)
        return self

    def __exit__(self, *exc: object) -> None:
        _event.unregister("numba:compile", self)


_lock_dir: str | None = None  # set while shared_compiles is active


@contextlib.contextmanager
def _function_lock(dispatcher: Any) -> Iterator[None]:
    """Hold the exclusive file lock named after ``dispatcher``'s function (while ``shared_compiles``)."""
    if _lock_dir is None:
        yield
        return
    key = hashlib.sha1(
        f"{dispatcher.py_func.__code__.co_filename}:{_kernel_name(dispatcher)}".encode()
    ).hexdigest()
    # the lock folder may have been removed under us (a cache cleared by hand): make it again
    os.makedirs(_lock_dir, exist_ok=True)
    with open(os.path.join(_lock_dir, key[:20] + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released on close, or when a crashed process exits
        yield


@contextlib.contextmanager
def shared_compiles(lock_dir: str | os.PathLike[str]) -> Iterator[None]:
    """While active, a kernel called from Python with argument types it has no machine code for (or
    compiled by ``compile_kernel``) compiles under an exclusive file lock named after the function: another
    process that needs the same function waits, then loads what the first one cached instead of compiling
    it again. One lock per function, not per signature, because numba rewrites a function's whole cache
    index when it saves an entry."""
    global _lock_dir
    from numba.core.dispatcher import Dispatcher

    Path(lock_dir).mkdir(parents=True, exist_ok=True)
    original = Dispatcher._compile_for_args  # type: ignore[attr-defined]

    def compile_for_args(self: Any, *args: Any, **kws: Any) -> Any:
        with _function_lock(self):
            return original(self, *args, **kws)

    Dispatcher._compile_for_args = compile_for_args  # type: ignore[attr-defined]
    _lock_dir = os.fspath(lock_dir)
    try:
        yield
    finally:
        _lock_dir = None
        Dispatcher._compile_for_args = original  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class CompileJob:
    """One warm-up job for a compiling process: ``target`` is ``"module:function"``, called with ``args``
    (picklable). It should import only what it compiles: each process pays its own imports."""

    name: str
    target: str
    args: tuple[Any, ...] = field(default=())


class _WouldCompile(Exception):
    """Raised from numba's compile event: a kernel is not in the cache."""


class _NoCompiling(CompileWatch):
    def __init__(self) -> None:
        super().__init__()
        self.allowed = 0  # > 0 while a compile is allowed after all (plan_compiles)

    def on_start(self, event: object) -> None:
        if not self.allowed:
            raise _WouldCompile

    def on_end(self, event: object) -> None:  # numba ends the event it could not start
        pass


@contextlib.contextmanager
def cached_only() -> Iterator[None]:
    """While active, a kernel numba would compile raises ``CacheMiss`` instead (before it starts, so
    nothing is half done); kernels in the cache load and run as usual."""
    try:
        with _NoCompiling():
            yield
    except _WouldCompile:
        raise CacheMiss from None


class CacheMiss(Exception):
    """``cached_only``: a kernel the cache does not hold was called."""


def _skipped(*args: Any, **kws: Any) -> None:
    return None


@functools.cache
def _returns_value(fn: Any) -> bool:
    """Whether a kernel's Python source returns a value anywhere (not only None)."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return True
    return any(
        isinstance(node, ast.Return)
        and node.value is not None
        and not (isinstance(node.value, ast.Constant) and node.value.value is None)
        for node in ast.walk(tree)
    )


def plan_compiles(run: Callable[[], object]) -> tuple[list[CompileJob], bool]:
    """Call ``run`` with compiling forbidden, listing the kernels it calls from Python that the cache lacks
    as ``compile_kernel`` jobs (each with the argument types of its call) instead of compiling them: such
    a call is skipped, so ``run`` goes on with whatever its outputs held (run it on scratch state). A
    kernel that returns a value is compiled and run here instead (its result may steer ``run``); kernels
    in the cache run as usual. Returns the jobs, in call order without repeats, and whether ``run``
    finished (it may not when it used something a skipped kernel left undefined)."""
    from numba.core.dispatcher import Dispatcher, OmittedArg
    from numba.core.types import Omitted

    jobs: dict[tuple[str, str, tuple[Any, ...]], CompileJob] = {}
    original = Dispatcher._compile_for_args  # type: ignore[attr-defined]
    guard = _NoCompiling()

    def record(self: Any, *args: Any, **kws: Any) -> Any:
        sig = tuple(Omitted(a.value) if isinstance(a, OmittedArg) else self.typeof_pyval(a) for a in args)
        key = (self.py_func.__module__, self.py_func.__qualname__, sig)
        if key in jobs:  # listed already: skip without another look into the cache
            return _skipped
        try:
            return original(self, *args, **kws)
        except _WouldCompile:
            pass
        if _returns_value(self.py_func):
            guard.allowed += 1
            try:
                return original(self, *args, **kws)
            finally:
                guard.allowed -= 1
        jobs[key] = CompileJob(_kernel_name(self), f"{__name__}:compile_kernel", key)
        return _skipped

    Dispatcher._compile_for_args = record  # type: ignore[attr-defined]
    try:
        with guard:
            run()
        finished = True
    except Exception:  # something a skipped kernel left undefined
        finished = False
    finally:
        Dispatcher._compile_for_args = original  # type: ignore[attr-defined]
    return list(jobs.values()), finished


def _resolve(module: str, qualname: str) -> Any:
    import importlib

    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def code_size(job: CompileJob) -> int:
    """For a ``compile_kernel`` job, the bytecode size of its kernel and of every numba function it calls
    (by global name, transitively): a rough measure of what compiling it costs (0 for other jobs)."""
    from numba.core.dispatcher import Dispatcher

    if not job.target.endswith(":compile_kernel"):
        return 0
    seen: set[int] = set()
    todo = [_resolve(job.args[0], job.args[1])]
    total = 0
    while todo:
        d = todo.pop()
        if id(d) in seen:
            continue
        seen.add(id(d))
        fn = d.py_func
        total += len(fn.__code__.co_code)
        names = set(fn.__code__.co_names)
        for const in fn.__code__.co_consts:  # generator expressions and comprehensions
            if hasattr(const, "co_names"):
                names.update(const.co_names)
        todo += [g for n in names if isinstance(g := fn.__globals__.get(n), Dispatcher)]
    return total


def compile_kernel(module: str, qualname: str, sig: tuple[Any, ...]) -> None:
    """A job: compile the kernel ``module.qualname`` for the argument types ``sig`` (into the cache)."""
    obj = _resolve(module, qualname)
    with _function_lock(obj):
        obj.compile(sig)  # loads from the cache when another process compiled it meanwhile


def _child() -> None:
    """A compiling process's body (``python -c``): read (lock dir, sys.path) and then one job at a time
    pickled on stdin; run each with compiles shared through the cache, writing one event line per kernel
    and one when the job ends (done or failed) on stdout; stop at the end of stdin."""
    import importlib
    import pickle

    lock_dir, path = pickle.load(sys.stdin.buffer)
    sys.path[:] = path
    events, sys.stdout = sys.stdout, sys.stderr  # only events on the pipe

    def send(*fields: object) -> None:
        events.write("\t".join(str(f).replace("\t", " ").replace("\n", " ") for f in fields) + "\n")
        events.flush()

    with shared_compiles(lock_dir), CompileWatch(lambda name, s: send("kernel", name, f"{s:.1f}")):
        while True:
            try:
                job = pickle.load(sys.stdin.buffer)
            except EOFError:
                return
            module, _, func = job.target.partition(":")
            try:
                getattr(importlib.import_module(module), func)(*job.args)
            except Exception as e:  # the caller compiles whatever this job did not
                send("failed", f"{type(e).__name__}: {e}")
            else:
                send("done")


def _say(report: Callable[[str], None] | None, msg: str) -> None:
    (report or log.info)(msg)


def _n_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def precompile(
    jobs: Sequence[CompileJob] | Callable[[], Sequence[CompileJob]],
    report: Callable[[str], None] | None = None,
    timeout: float = 1800.0,
    processes: int | None = None,
) -> int:
    """Run ``jobs`` in ``processes`` compiling processes (default: one per CPU, at most one per job), each
    taking the next job in order when it finishes one (so put the longest first), and report each kernel
    they compile as it finishes (``report``, default INFO lines on this module's logger). Returns the
    number of kernels compiled. ``jobs`` may be a function that lists them: it is called once the
    processes are starting (``processes`` of them), so they import numba while it runs.

    A process is a fresh interpreter (``python -c``, never a re-import of ``__main__``) that imports only
    what its jobs need. A failing job is reported, not raised: whatever it did not cache the caller
    compiles itself later. Does nothing without a numba cache directory."""
    if not _cache_dir() or (not callable(jobs) and not jobs):
        return 0
    t0 = time.perf_counter()
    n_procs = max(1, processes or _n_cpus())
    if not callable(jobs):
        n_procs = min(n_procs, len(jobs))
    lines: queue.SimpleQueue[tuple[int, str | None]] = queue.SimpleQueue()
    procs = [_spawn(i, lines) for i in range(n_procs)]
    pool: _Pool | None = None
    try:
        todo = list(jobs() if callable(jobs) else jobs)
        where = f"first start; cached in {_cache_dir()}"
        _say(report, f"compiling kernels: {len(todo)} jobs in {n_procs} processes ({where})")
        pool = _Pool(procs, todo)
        n_kernels = pool.run(lines, t0 + timeout, report)
    finally:
        (pool or _Pool(procs, [])).stop()  # kills what still runs after the timeout
    _say(report, f"compiled {n_kernels} kernels in {time.perf_counter() - t0:.1f} s")
    return n_kernels


def _spawn(index: int, lines: queue.SimpleQueue[tuple[int, str | None]]) -> subprocess.Popen[bytes]:
    import pickle

    proc = subprocess.Popen(
        [sys.executable, "-c", "from llama_quant.compiling import _child; _child()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(pickle.dumps((os.path.join(_cache_dir(), "locks"), sys.path)))
    proc.stdin.flush()
    out = proc.stdout

    def read() -> None:
        for raw in out:
            lines.put((index, raw.decode(errors="replace").rstrip("\n")))
        lines.put((index, None))

    threading.Thread(target=read, name=f"compile-{index}", daemon=True).start()
    return proc


class _Pool:
    """Compiling processes fed one job at a time from a shared list, in order."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], jobs: list[CompileJob]) -> None:
        self.procs, self.todo, self.n_jobs = procs, jobs, len(jobs)
        self.current: list[CompileJob | None] = [None] * len(procs)
        self.finished = 0
        for i in range(len(procs)):
            self._feed(i)

    def _feed(self, i: int) -> None:
        """Give process i the next job, or close its stdin (it then exits) when none is left."""
        import pickle

        stdin = self.procs[i].stdin
        assert stdin is not None
        job = self.todo.pop(0) if self.todo else None
        self.current[i] = job
        with contextlib.suppress(OSError):  # a process that died reports its end on stdout
            if job is None:
                stdin.close()
            else:
                stdin.write(pickle.dumps(job))
                stdin.flush()

    def run(
        self,
        lines: queue.SimpleQueue[tuple[int, str | None]],
        deadline: float,
        report: Callable[[str], None] | None,
    ) -> int:
        """Report the processes' event lines until every process's output has ended."""
        n_kernels, ended = 0, 0
        while ended < len(self.procs):
            try:
                i, line = lines.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                break
            job = self.current[i]
            if line is None:
                ended += 1
                if job is not None:  # the process died within a job
                    self._end(i, job, "failed (the compiling process exited)", report)
                continue
            kind, _, rest = line.partition("\t")
            if kind == "kernel" and job is not None:
                n_kernels += 1
                name, _, seconds = rest.partition("\t")
                where = "" if job.name == name else f"{job.name}, "  # a kernel job names its kernel
                _say(report, f"compiling kernels: #{n_kernels} {name} ({where}{seconds} s)")
            elif kind in ("done", "failed") and job is not None:
                self._end(i, job, "done" if kind == "done" else f"failed ({rest})", report)
                self._feed(i)
        return n_kernels

    def _end(self, i: int, job: CompileJob, state: str, report: Callable[[str], None] | None) -> None:
        self.finished += 1
        self.current[i] = None
        _say(report, f"compiling kernels: {self.finished}/{self.n_jobs} jobs finished, {job.name} {state}")

    def stop(self) -> None:
        """End every process: each has ended its output by now, unless the deadline passed."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdin is not None:
                with contextlib.suppress(OSError):
                    p.stdin.close()


# On import, so that `import llama_quant` (which imports this module first) settles where numba caches
# before any kernel module is decorated.
configure_cache()
