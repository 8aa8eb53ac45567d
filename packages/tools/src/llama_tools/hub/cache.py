"""The model cache on disk, in the Hugging Face hub layout llama.cpp uses:
`<cache>/models--<user>--<repo>/snapshots/<commit>/<path>` (plus `blobs/` and `refs/main`)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .names import COMPANION_MARKERS, best_model_file, split_info, split_spec, valid_repo_id

__all__ = ["CachedModel", "cache_dir", "list_cached", "remove_cached", "repo_dir", "resolve_cached"]


@dataclass(frozen=True, slots=True)
class CachedModel:
    """One `user/repo:TAG` in the cache: its model file (first shard) and projector, if any."""

    name: str
    repo: str
    tag: str
    path: Path
    mmproj: Path | None


def cache_dir() -> Path:
    """`LLAMA_CACHE`, else the Hugging Face hub cache (`HF_HUB_CACHE`, `HF_HOME/hub`, XDG, ~/.cache)."""
    env = os.environ
    for var, sub in (
        ("LLAMA_CACHE", ""),
        ("HF_HUB_CACHE", ""),
        ("HUGGINGFACE_HUB_CACHE", ""),
        ("HF_HOME", "hub"),
        ("XDG_CACHE_HOME", "huggingface/hub"),
    ):
        if env.get(var):
            return Path(env[var]) / sub if sub else Path(env[var])
    return Path.home() / ".cache" / "huggingface" / "hub"


def repo_dir(repo: str, root: Path | None = None) -> Path:
    """The cache folder of `user/repo` (the id must be valid: no traversal out of the cache)."""
    if not valid_repo_id(repo):
        raise ValueError(f"invalid repository id: {repo!r}")
    return (root or cache_dir()) / ("models--" + repo.replace("/", "--"))


def _snapshot_files(folder: Path) -> list[tuple[str, Path]]:
    """(path inside the repo, local path) of every file of every snapshot, newest snapshot first."""
    snaps = folder / "snapshots"
    if not snaps.is_dir():
        return []
    out: list[tuple[str, Path]] = []
    for snap in sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True):
        for f in sorted(snap.rglob("*")):
            if f.is_file() and not f.name.endswith(".tmp"):
                out.append((f.relative_to(snap).as_posix(), f))
    return out


def _url_files(base: Path) -> dict[str, CachedModel]:
    """Models downloaded from a plain URL: `<cache>/<name>.gguf` (first part of a split model), named
    by the file name without `.gguf` and part suffix; `repo` and `tag` are empty."""
    found: dict[str, CachedModel] = {}
    for f in sorted(base.glob("*.gguf")):
        info = split_info(f.name)
        if info is None or info.index != 1 or any(k in f.name for k in COMPANION_MARKERS):
            continue
        if f.is_file() and info.prefix not in found:
            found[info.prefix] = CachedModel(info.prefix, "", "", f, None)
    return found


def list_cached(root: Path | None = None) -> list[CachedModel]:
    """Every `user/repo:TAG` with a complete first shard in the cache, and every model downloaded from
    a plain URL, sorted by name."""
    base = root or cache_dir()
    if not base.is_dir():
        return []
    found: dict[str, CachedModel] = _url_files(base)
    for folder in sorted(base.glob("models--*--*")):
        repo = folder.name[len("models--") :].replace("--", "/")
        if not valid_repo_id(repo):
            continue
        files = _snapshot_files(folder)
        for rel, local in files:
            info = split_info(rel)
            name = rel.rsplit("/", 1)[-1]
            if info is None or info.index != 1 or not info.tag or any(k in name for k in COMPANION_MARKERS):
                continue
            key = f"{repo}:{info.tag}"
            if key not in found:
                found[key] = CachedModel(key, repo, info.tag, local, _mmproj(files, rel))
    return sorted(found.values(), key=lambda m: m.name)


def _mmproj(files: list[tuple[str, Path]], model: str) -> Path | None:
    folder = model.rsplit("/", 1)[0] if "/" in model else ""
    for rel, local in files:
        same_folder = (rel.rsplit("/", 1)[0] if "/" in rel else "") == folder
        if "mmproj" in rel.rsplit("/", 1)[-1] and rel.endswith(".gguf") and same_folder:
            return local
    return None


def resolve_cached(spec: str, root: Path | None = None) -> CachedModel | None:
    """The cached files `user/repo[:tag]` stands for (the tag rules of `best_model_file`), or None."""
    repo, tag = split_spec(spec)
    folder = repo_dir(repo, root)
    files = _snapshot_files(folder)
    rel = best_model_file([r for r, _ in files], tag)
    if rel is None:
        return None
    info = split_info(rel)
    local = dict(files)[rel]
    t = info.tag if info else tag
    return CachedModel(f"{repo}:{t}", repo, t, local, _mmproj(files, rel))


def remove_cached(spec: str, root: Path | None = None) -> bool:
    """Delete a cached `user/repo:TAG` (its files of that tag, and the repo folder once empty of models);
    without a tag the whole repository; a name without `/` is a URL download. True when something was
    removed."""
    if "/" not in spec:
        return _remove_url_file(spec, root or cache_dir())
    repo, tag = split_spec(spec)
    folder = repo_dir(repo, root)
    if not folder.is_dir():
        return False
    if not tag:
        shutil.rmtree(folder, ignore_errors=True)
        return True
    removed = False
    for rel, local in _snapshot_files(folder):
        info = split_info(rel)
        if info is not None and info.tag == tag:
            target = local.resolve()
            local.unlink(missing_ok=True)
            if target != local and target.is_relative_to(folder.resolve()):
                target.unlink(missing_ok=True)  # the blob the snapshot link pointed at
            removed = True
    if removed and not any(split_info(r) for r, _ in _snapshot_files(folder)):
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def _remove_url_file(name: str, base: Path) -> bool:
    hit = _url_files(base).get(name) if base.is_dir() else None
    if hit is None:
        return False
    for f in base.glob("*.gguf"):
        info = split_info(f.name)
        if info is not None and info.prefix == name:
            f.unlink(missing_ok=True)
    return True
