"""Where numba's cache lives, compile progress, and precompiling in child processes (real numba compiles of
tiny kernels, in a fresh cache directory per test)."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from numba.core import config as numba_config

from llama_quant.compiling import (
    CacheMiss,
    CompileJob,
    CompileWatch,
    cached_only,
    default_cache_dir,
    plan_compiles,
    precompile,
    prune_caches,
    shared_compiles,
    sources_digest,
)

_KERNELS = """
from numba import njit


@njit(cache=True)
def twice(x):
    return x * 2.0


@njit(cache=True)
def plus_one(x):
    return x + 1.0


def run_twice():
    twice(1.5)


def run_both():
    twice(1.5)
    plus_one(2)


@njit(cache=True)
def fill(out, x):
    for i in range(len(out)):
        out[i] = x


def run_filled():
    import numpy as np

    out = np.zeros(3)
    fill(out, 2.0)
    n = int(twice(1.5))  # a result the caller uses: planned by compiling it
    fill(out[:n], 1)
    return out
"""


def _cache_dir_in_child(env: dict[str, str], code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME")} | env
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout.strip()


_PRINT_CACHE_DIR = "import llama_quant; from numba.core import config; print(config.CACHE_DIR)"


def test_default_cache_dir_is_the_user_cache(tmp_path: Path) -> None:
    got = Path(_cache_dir_in_child({"XDG_CACHE_HOME": str(tmp_path / "xdg")}, _PRINT_CACHE_DIR))
    assert got == tmp_path / "xdg" / "llama-py" / "numba" / f"src-{sources_digest()}"
    assert got.is_dir()
    home = Path(_cache_dir_in_child({"HOME": str(tmp_path / "home")}, _PRINT_CACHE_DIR))
    assert home.parent == tmp_path / "home" / ".cache" / "llama-py" / "numba"


def test_a_source_change_starts_a_new_cache_and_old_ones_are_pruned(tmp_path: Path) -> None:
    base = tmp_path / "xdg" / "llama-py" / "numba"
    for i in range(5):  # caches of earlier source versions, the newest last
        (base / f"src-old{i}").mkdir(parents=True)
        os.utime(base / f"src-old{i}", (1000 + i, 1000 + i))
    legacy = base / "kquants_0123456789abcdef0123456789abcdef01234567"  # the layout before source versions
    legacy.mkdir()
    os.utime(legacy, (1000, 1000))  # unused for long: only such caches are pruned
    got = Path(_cache_dir_in_child({"XDG_CACHE_HOME": str(tmp_path / "xdg")}, _PRINT_CACHE_DIR))
    assert sorted(p.name for p in base.iterdir()) == sorted([got.name, "src-old3", "src-old4"])


def test_the_digest_follows_each_source_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import llama_quant.compiling as mod

    pkg = tmp_path / "src" / "kernel_pkg_digest"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "k.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setattr(mod, "_KERNEL_PACKAGES", ("kernel_pkg_digest",))
    before = sources_digest()
    assert sources_digest() == before
    (pkg / "k.py").write_text("x = 22\n")  # another size
    assert sources_digest() != before


def test_numba_cache_dir_is_respected(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    got = _cache_dir_in_child(
        {"NUMBA_CACHE_DIR": str(mine), "XDG_CACHE_HOME": str(tmp_path / "xdg")}, _PRINT_CACHE_DIR
    )
    assert got == str(mine)
    assert not (tmp_path / "xdg").exists()


def test_default_cache_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "llama-py" / "numba"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert default_cache_dir() == tmp_path / "h" / ".cache" / "llama-py" / "numba"


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A module of two tiny cached kernels, importable here and in spawned children, and an empty
    numba cache used by both."""
    name = f"tiny_kernels_{tmp_path.name.replace('-', '_')}"
    src = tmp_path / "src"
    src.mkdir()
    (src / f"{name}.py").write_text(textwrap.dedent(_KERNELS))
    cache = tmp_path / "numba"
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))
    monkeypatch.setattr(numba_config, "CACHE_DIR", str(cache))
    return name


def test_progress_counts_jobs_and_kernels(kernels: str) -> None:
    lines: list[str] = []
    jobs = [CompileJob("first", f"{kernels}:run_both"), CompileJob("second", f"{kernels}:run_twice")]
    n = precompile(jobs, lines.append)
    assert n == 2  # twice and plus_one, each compiled once across both children
    kernel_lines = [line for line in lines if line.startswith("compiling kernels: #")]
    assert len(kernel_lines) == 2
    assert {line.split()[3] for line in kernel_lines} == {f"{kernels}.twice", f"{kernels}.plus_one"}
    finished = [line for line in lines if "jobs finished" in line]
    assert [line.split()[2] for line in finished] == ["1/2", "2/2"]
    assert all(line.endswith("done") for line in finished)
    assert lines[-1].startswith("compiled 2 kernels in ")


def test_precompiled_cache_is_loaded_not_compiled(kernels: str) -> None:
    assert precompile([CompileJob("both", f"{kernels}:run_both")], lambda _: None) == 2
    # a second process compiles nothing
    assert precompile([CompileJob("again", f"{kernels}:run_both")], lambda _: None) == 0
    # nor does this one: it loads what the children cached
    module = importlib.import_module(kernels)
    with CompileWatch() as watch:
        assert module.twice(1.5) == 3.0
        assert module.plus_one(2) == 3.0
    assert watch.compiled == []


def test_watch_reports_compiles_here(kernels: str) -> None:
    module = importlib.import_module(kernels)
    seen: list[str] = []
    with CompileWatch(lambda name, seconds: seen.append(name)) as watch:
        module.run_both()
    assert seen == [f"{kernels}.twice", f"{kernels}.plus_one"]
    assert [name for name, _ in watch.compiled] == seen


def test_a_failing_job_is_reported(kernels: str) -> None:
    lines: list[str] = []
    assert precompile([CompileJob("broken", f"{kernels}:no_such_function")], lines.append) == 0
    assert any("broken failed (AttributeError" in line for line in lines)


def test_plan_lists_what_a_run_would_compile(kernels: str) -> None:
    module = importlib.import_module(kernels)
    jobs, finished = plan_compiles(module.run_filled)
    assert finished
    # fill twice (float and int argument), each skipped; twice returns a value, so it was compiled here
    assert [job.name for job in jobs] == [f"{kernels}.fill", f"{kernels}.fill"]
    assert [str(job.args[2][1]) for job in jobs] == ["float64", "int64"]
    with pytest.raises(CacheMiss), cached_only():
        module.fill(np.zeros(2), 1.0)  # planned, not compiled
    lines: list[str] = []
    # three jobs for two processes: the first free process takes the third
    assert precompile([*jobs, CompileJob("run", f"{kernels}:run_both")], lines.append, processes=2) == 3
    assert sum("jobs finished" in line for line in lines) == 3
    with CompileWatch() as watch:
        assert module.run_filled().tolist() == [1.0, 1.0, 1.0]
    assert watch.compiled == []


_INSTALL = """
import os, sys
import llama_quant.compiling as c
print(c._cache_dir(), flush=True)
sys.stdin.readline()
with c.shared_compiles(os.path.join(c._cache_dir(), "locks")):
    import {mod}
    {mod}.run_both()
    {mod}.run_filled()
print("compiled", flush=True)
"""


def _install(tmp_path: Path, name: str) -> Path:
    """A second copy of llama_quant: another path, so another sources digest (another install)."""
    import llama_quant

    root = tmp_path / name
    shutil.copytree(
        Path(llama_quant.__file__).parent, root / "llama_quant", ignore=shutil.ignore_patterns("__pycache__")
    )
    return root


def _start(root: Path, src: Path, xdg: Path, code: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME")}
    env |= {"XDG_CACHE_HOME": str(xdg), "PYTHONPATH": os.pathsep.join([str(root), str(src)])}
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def test_two_installs_compile_at_once_and_keep_each_others_cache(tmp_path: Path) -> None:
    """Two installs (two sources digests) in separate processes: the second one's start prunes the old
    idle cache but not the first one's, which is older than the caches it keeps yet in use; then both
    compile into their caches at the same time."""
    mod = f"tiny_installs_{tmp_path.name.replace('-', '_')}"
    src = tmp_path / "src"
    src.mkdir()
    (src / f"{mod}.py").write_text(textwrap.dedent(_KERNELS))
    xdg, base = tmp_path / "xdg", tmp_path / "xdg" / "llama-py" / "numba"
    code = _INSTALL.format(mod=mod)
    a = _start(_install(tmp_path, "a"), src, xdg, code)
    b = None
    try:
        assert a.stdout is not None
        dir_a = Path(a.stdout.readline().strip())
        assert dir_a.parent == base and (dir_a / "in-use.lock").is_file()
        future = time.time() + 1000
        for i in range(3):  # caches used more recently than the first install's
            (base / f"src-newer{i}").mkdir()
            os.utime(base / f"src-newer{i}", (future + i, future + i))
        (base / "src-idle").mkdir()
        os.utime(base / "src-idle", (1000, 1000))
        b = _start(_install(tmp_path, "b"), src, xdg, code)
        assert b.stdout is not None and b.stdin is not None and a.stdin is not None
        dir_b = Path(b.stdout.readline().strip())
        assert dir_b.parent == base and dir_b != dir_a
        assert dir_a.is_dir(), "an install removed the cache another one is using"
        assert not (base / "src-idle").exists(), "the old idle cache was kept"
        assert (base / "src-newer0").is_dir() and (base / "src-newer2").is_dir()  # recently used: kept
        for p in (a, b):  # both compile now, at once
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in (a, b):
            out, _ = p.communicate(timeout=300)
            assert p.returncode == 0 and out.strip() == "compiled", out
        assert list(dir_a.rglob("*.nbi")) and list(dir_b.rglob("*.nbi"))
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    # nobody uses the first install's cache any more: now it may go
    assert dir_a in prune_caches(base, dir_b, keep=1, idle_seconds=0)


_HOLD = "import sys, llama_quant; print('ready', flush=True); sys.stdin.readline()"


def test_a_cache_in_use_is_not_pruned(tmp_path: Path) -> None:
    """A process using a cache (here one named by NUMBA_CACHE_DIR) holds it for its lifetime: however old,
    it is not pruned until that process is gone."""
    base = tmp_path / "numba"
    used, current = base / "src-used", base / "src-current"
    current.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"} | {"NUMBA_CACHE_DIR": str(used)}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        os.utime(used, (1000, 1000))
        assert prune_caches(base, current, keep=1, idle_seconds=0) == []
        assert used.is_dir()
    finally:
        holder.communicate("\n", timeout=60)
    assert prune_caches(base, current, keep=1, idle_seconds=0) == [used]
    assert not used.exists() and current.is_dir()


def test_a_recently_used_cache_is_not_pruned(tmp_path: Path) -> None:
    base = tmp_path / "numba"
    for name in ("src-current", "src-recent", "src-old"):
        (base / name).mkdir(parents=True)
    os.utime(base / "src-old", (1000, 1000))
    assert prune_caches(base, base / "src-current", keep=1, idle_seconds=3600) == [base / "src-old"]
    assert (base / "src-recent").is_dir()


def test_a_removed_lock_folder_is_made_again(kernels: str) -> None:
    mod = importlib.import_module(kernels)
    lock_dir = Path(numba_config.CACHE_DIR) / "locks"
    with shared_compiles(lock_dir):
        shutil.rmtree(lock_dir)  # e.g. a cache cleared by hand while a server runs
        assert mod.twice(1.5) == 3.0
    assert lock_dir.is_dir()
