"""Downloading a model into the cache: a Hugging Face spec `user/repo[:quant]` (the hub layout, blobs
linked from the snapshot) or a plain URL (`<cache>/<file name>`, every split part). Nothing is written
outside the cache directory; files already there are not fetched again; `offline` uses the cache only."""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from .cache import cache_dir, resolve_cached
from .http import HubError, hub_client
from .names import split_info, split_spec
from .remote import FileTask, Plan, hf_plan, split_parts
from .transfer import Progress, fetch_file

__all__ = ["Downloaded", "download_model", "is_url", "plan_model", "url_file_name"]

_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,254}$")


@dataclass(frozen=True, slots=True)
class Downloaded:
    """The result: the catalogue name, the model file to load (first part) and the projector, if any."""

    name: str
    path: Path
    mmproj: Path | None = None


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def url_file_name(url: str) -> str:
    """The cache file name of a URL download (its last path segment), validated: no traversal, no
    hidden files, no separators."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HubError(f"not an http(s) URL: {url}", 400)
    name = parts.path.rsplit("/", 1)[-1]
    if not _FILE.match(name) or ".." in name:
        raise HubError(f"the URL does not end in a usable file name: {url}", 400)
    return name


def _inside(root: Path, path: Path) -> bool:
    return os.path.abspath(path).startswith(os.path.abspath(root) + os.sep)


def _url_plan(url: str, root: Path) -> Plan:
    name = url_file_name(url)
    base = url.split("?", 1)[0].split("#", 1)[0]
    prefix = base[: len(base) - len(name)]
    tasks = [FileTask(prefix + part, part, root / part, root / part) for part in split_parts(name)]
    info = split_info(name)
    label = info.prefix.rsplit("/", 1)[-1] if info else name
    return Plan(label, model=tasks)


def plan_model(
    spec: str,
    *,
    hf_file: str = "",
    token: str | None = None,
    mmproj: bool = True,
    root: Path | None = None,
    client: httpx.Client | None = None,
) -> Plan:
    """What downloading `spec` fetches (asks the hub for a Hugging Face spec). Raises HubError."""
    root = root or cache_dir()
    if is_url(spec):
        plan = _url_plan(spec, root)
    else:
        own = client is None
        client = client or hub_client(token)
        try:
            plan = hf_plan(spec, client, hf_file=hf_file, root=root, mmproj=mmproj)
        finally:
            if own:
                client.close()
    for t in plan.files:
        if not (_inside(root, t.dest) and _inside(root, t.final)):
            raise HubError(f"refusing to write outside the cache: {t.path}", 400)
    return plan


def _finalize(task: FileTask) -> None:
    """Link the snapshot path to its blob (a relative symlink; a move where links are not allowed)."""
    if task.dest == task.final or task.final.exists():
        return
    task.final.parent.mkdir(parents=True, exist_ok=True)
    try:
        task.final.symlink_to(os.path.relpath(task.dest, task.final.parent))
    except OSError:
        os.replace(task.dest, task.final)


def _write_ref(root: Path, plan: Plan) -> None:
    if not plan.repo:
        return
    refs = root / ("models--" + plan.repo.replace("/", "--")) / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    tmp = refs / "main.tmp"
    tmp.write_text(plan.commit)
    os.replace(tmp, refs / "main")


def download_model(
    spec: str,
    *,
    hf_file: str = "",
    token: str | None = None,
    offline: bool = False,
    mmproj: bool = True,
    root: Path | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    retry_delay: float = 1.0,
) -> Downloaded:
    """Fetch `spec` (a Hugging Face spec or URL) into the cache, or find it there when `offline`."""
    root = root or cache_dir()
    if offline:
        return _offline(spec, hf_file, root)
    with hub_client(token) as client:
        plan = plan_model(spec, hf_file=hf_file, mmproj=mmproj, root=root, client=client)
        for t in plan.files:
            if t.final.exists() or t.dest.exists():
                if progress:
                    size = (t.final if t.final.exists() else t.dest).stat().st_size
                    progress(t.url, size, size)
            else:
                fetch_file(client, t.url, t.dest, size=t.size, progress=progress, cancel=cancel,
                           retry_delay=retry_delay)  # fmt: skip
            _finalize(t)
    _write_ref(root, plan)
    name = plan.name
    if plan.repo:
        _, tag = split_spec(spec)
        info = split_info(plan.model[0].path)
        name = (
            f"{plan.repo}:{info.tag}" if info and info.tag else (f"{plan.repo}:{tag}" if tag else plan.repo)
        )
    return Downloaded(name, plan.model[0].final, plan.mmproj.final if plan.mmproj else None)


def _offline(spec: str, hf_file: str, root: Path) -> Downloaded:
    if is_url(spec):
        plan = _url_plan(spec, root)
        missing = [t.path for t in plan.files if not t.final.exists()]
        if missing:
            raise HubError(f"required file is not available in cache (offline mode): {missing[0]}", 404)
        return Downloaded(plan.name, plan.model[0].final)
    if hf_file:
        repo, _ = split_spec(spec)
        info = split_info(hf_file)
        cached = resolve_cached(f"{repo}:{info.tag if info else ''}", root)
    else:
        cached = resolve_cached(spec, root)
    if cached is None:
        raise HubError(f"model {spec} is not available in the cache (offline mode)", 404)
    return Downloaded(cached.name, cached.path, cached.mmproj)
