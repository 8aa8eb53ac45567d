"""Names in the model cache: `user/repo[:TAG]` specs, GGUF file names (quant tag, split shards) and which
file of a repository a tag picks (llama.cpp's `common/download.cpp` rules)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "COMPANION_MARKERS",
    "SplitInfo",
    "best_model_file",
    "is_model_file",
    "split_info",
    "split_spec",
    "valid_repo_id",
]

# file-name markers of files that ride along with a model and are not models themselves
COMPANION_MARKERS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_REPO = re.compile(r"^[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*/[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*$")
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")


@dataclass(frozen=True, slots=True)
class SplitInfo:
    """A GGUF path without `.gguf` and shard suffix (`prefix`), its upper-case quant tag, shard index/count."""

    prefix: str
    tag: str
    index: int
    count: int


def split_info(path: str) -> SplitInfo | None:
    """None for a path that is not a `.gguf` file."""
    if not path.endswith(".gguf"):
        return None
    prefix, index, count = path[:-5], 1, 1
    if m := _SPLIT.match(prefix):
        prefix, index, count = m[1], int(m[2]), int(m[3])
    m = _TAG.search(prefix)
    return SplitInfo(prefix, m[1].upper() if m else "", index, count)


def is_model_file(path: str) -> bool:
    """A `.gguf` file that is a model (not a projector, imatrix or draft companion)."""
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".gguf") and not any(k in name for k in COMPANION_MARKERS)


def valid_repo_id(repo: str) -> bool:
    """`user/repo` with [A-Za-z0-9_] runs joined by single `.`/`-` (no `..`, no leading dot, one slash)."""
    return 0 < len(repo) <= 256 and _REPO.match(repo) is not None


def split_spec(spec: str) -> tuple[str, str]:
    """`user/repo:tag` -> (`user/repo`, `TAG`); the tag is empty when absent."""
    repo, _, tag = spec.partition(":")
    return repo, tag.upper()


def best_model_file(paths: list[str], tag: str) -> str | None:
    """The file a tag picks among a repository's files: the first model file whose name has `<tag>.` or
    `<tag>-` (case-insensitive; first shard only); with no tag Q4_K_M, then Q8_0, then any model file."""
    candidates = [p for p in paths if is_model_file(p) and _first_shard(p)]
    for t in (tag,) if tag else DEFAULT_TAGS:
        pattern = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        for p in candidates:
            if pattern.search(p):
                return p
    if not tag and candidates:
        return candidates[0]
    return None


def _first_shard(path: str) -> bool:
    info = split_info(path)
    return info is not None and (info.count <= 1 or info.index == 1)
