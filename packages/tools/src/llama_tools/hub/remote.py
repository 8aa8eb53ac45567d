"""What a `user/repo[:quant]` spec downloads (llama.cpp's `common/download.cpp` plan): the repository's
main commit and file tree from the hub API (`api/models/<repo>/refs`, `.../tree/<commit>?recursive=true`),
the model file the tag picks with all its split parts, and the projector beside it. Every name the hub
returns is checked before it becomes a path: commits and object ids are hex, file paths stay inside the
snapshot folder."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import httpx

from .cache import repo_dir
from .http import HubError, model_endpoint
from .names import best_model_file, split_info, split_spec, valid_repo_id

__all__ = ["FileTask", "Plan", "hf_plan", "safe_subpath", "split_parts"]

_HEX40 = re.compile(r"^[0-9a-fA-F]{40}$")
_OID = re.compile(r"^(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})$")
_BRANCH = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True, slots=True)
class FileTask:
    """One file to fetch: `dest` is written (through a temporary file), `final` is where the cache
    lists it (a link to `dest` when the hub stores it as a blob)."""

    url: str
    path: str
    dest: Path
    final: Path
    size: int | None = None


@dataclass(slots=True)
class Plan:
    """The files of one spec: the model's parts (first part first) and an optional projector."""

    name: str
    repo: str = ""
    commit: str = ""
    model: list[FileTask] = field(default_factory=list)
    mmproj: FileTask | None = None

    @property
    def files(self) -> list[FileTask]:
        return [*self.model, *([self.mmproj] if self.mmproj else [])]


def safe_subpath(path: str) -> bool:
    """A relative POSIX path with no `..`, empty, dot-leading or backslash parts."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        return False
    parts = PurePosixPath(path).parts
    return all(p not in ("", ".", "..") and not p.startswith(".") for p in parts)


def _api_get(client: httpx.Client, url: str) -> Any:
    try:
        r = client.get(url, headers={"Accept": "application/json"})
    except httpx.HTTPError as e:
        raise HubError(f"cannot reach the model hub: {e or type(e).__name__}") from None
    if r.status_code != 200:
        detail = r.text[:300]
        with contextlib.suppress(ValueError, AttributeError):
            detail = str(r.json().get("error", detail))
        code = 404 if r.status_code in (401, 403, 404) else 500
        raise HubError(f"GET failed ({r.status_code}): {detail}", code)
    try:
        return r.json()
    except ValueError:
        raise HubError("the model hub answered with invalid JSON") from None


def _main_commit(client: httpx.Client, endpoint: str, repo: str) -> tuple[str, str]:
    data = _api_get(client, f"{endpoint}api/models/{repo}/refs")
    branches = data.get("branches") if isinstance(data, dict) else None
    chosen: tuple[str, str] | None = None
    for b in branches if isinstance(branches, list) else []:
        name, commit = (b.get("name"), b.get("targetCommit")) if isinstance(b, dict) else (None, None)
        if not (isinstance(name, str) and isinstance(commit, str)):
            continue
        if not _HEX40.match(commit) or not _BRANCH.match(name):
            continue  # never a path out of refs/, nor a snapshot folder named by the hub
        if name == "main":
            return name, commit.lower()
        chosen = chosen or (name, commit.lower())
    if chosen is None:
        raise HubError(f"no valid branch for '{repo}'", 404)
    return chosen


def _tree(client: httpx.Client, endpoint: str, repo: str, commit: str) -> list[tuple[str, str, int | None]]:
    data = _api_get(client, f"{endpoint}api/models/{repo}/tree/{commit}?recursive=true")
    if not isinstance(data, list):
        raise HubError(f"the file list of '{repo}' is not an array")
    out = []
    for item in data:
        if not isinstance(item, dict) or item.get("type") != "file" or not isinstance(item.get("path"), str):
            continue
        path = item["path"]
        lfs = item.get("lfs") if isinstance(item.get("lfs"), dict) else None
        oid = (lfs or item).get("oid", "")
        size = (lfs or item).get("size")
        if not safe_subpath(path) or (oid and not (isinstance(oid, str) and _OID.match(oid))):
            continue
        out.append((path, oid.lower() if oid else "", size if isinstance(size, int) and size >= 0 else None))
    return out


def split_parts(path: str) -> list[str]:
    """Every part of a split GGUF path (`-00001-of-00003.gguf` -> three paths); the path itself otherwise."""
    info = split_info(path)
    if info is None or info.count <= 1:
        return [path]
    return [f"{info.prefix}-{i:05d}-of-{info.count:05d}.gguf" for i in range(1, info.count + 1)]


def _quant_bits(path: str) -> int:
    info = split_info(path)
    m = re.search(r"[0-9]+", info.tag if info else "")
    return int(m[0]) if m else 0


def _best_mmproj(paths: list[str], model: str) -> str | None:
    """A projector in the model's folder (or a parent), the deepest, then closest in quant bits."""
    model_dir = PurePosixPath(model).parent.parts
    best: tuple[int, int, str] | None = None
    for p in paths:
        if not p.endswith(".gguf") or "mmproj" not in p:
            continue
        d = PurePosixPath(p).parent.parts
        if d != model_dir[: len(d)]:
            continue
        key = (-len(d), abs(_quant_bits(p) - _quant_bits(model)), p)
        best = key if best is None or key < best else best
    return best[2] if best else None


def hf_plan(
    spec: str,
    client: httpx.Client,
    *,
    hf_file: str = "",
    root: Path,
    mmproj: bool = True,
    endpoint: str | None = None,
) -> Plan:
    """The download plan of `user/repo[:quant]` (or `hf_file` in that repo), from the hub API."""
    repo, tag = split_spec(spec)
    if not valid_repo_id(repo):
        raise HubError("invalid HF repo format, expected <user>/<model>[:quant]", 400)
    endpoint = endpoint or model_endpoint()
    _, commit = _main_commit(client, endpoint, repo)
    files = _tree(client, endpoint, repo, commit)
    by_path = {p: (oid, size) for p, oid, size in files}
    if hf_file:
        if hf_file not in by_path:
            raise HubError(f"file '{hf_file}' not found in repository {repo}", 404)
        primary = hf_file
    else:
        found = best_model_file([p for p, _, _ in files], tag)
        if found is None:
            raise HubError(
                f"no GGUF files found in repository {repo}" + (f" for tag {tag}" if tag else ""), 404
            )
        primary = found
    folder = repo_dir(repo, root)
    info = split_info(primary)
    plan = Plan(f"{repo}:{info.tag}" if info and info.tag else repo, repo, commit)

    def task(path: str) -> FileTask:
        if path not in by_path:
            raise HubError(f"split part '{path}' is missing from repository {repo}", 404)
        oid, size = by_path[path]
        final = folder / "snapshots" / commit / path
        dest = folder / "blobs" / oid if oid else final
        url = f"{endpoint}{repo}/resolve/{commit}/{quote(path)}"
        return FileTask(url, path, dest, final, size)

    plan.model = [task(p) for p in split_parts(primary)]
    if mmproj:
        proj = _best_mmproj(list(by_path), primary)
        plan.mmproj = task(proj) if proj else None
    return plan
