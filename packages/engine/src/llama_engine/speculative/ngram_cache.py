"""ngram-cache: empirical next-token counts of 1..4-grams, from three sources (llama.cpp's lookup decoding).

The context cache learns from the sequence itself; the dynamic cache (`-lcd` file) from earlier
generations (only on a server without API keys: it drafts for every caller); the static cache (`-lcs` file) from a corpus, and only validates. A token is drafted from
the longest n-gram whose counts are large and one-sided enough (lax thresholds for the context, strict
ones for the dynamic cache), else from the static cache alone; at most 8 tokens.

Files have llama.cpp's layout (`common_ngram_cache_save`): per n-gram, 4 int32 tokens (-1 padded), an
int32 count of followers, then (int32 token, int32 count) pairs. The dynamic file is read at start-up
when it exists and written back (atomically) at shutdown: only a `-lcd` path given by the operator is
ever written.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .config import NGRAM_CACHE_N_DRAFT
from .drafter import DraftJob

__all__ = ["NgramCache", "NgramCacheError", "load_ngram_cache", "save_ngram_cache"]

NGRAM_MIN, NGRAM_MAX, NGRAM_STATIC = 1, 4, 2
_NULL = -1
_LAX_SIZE, _LAX_PCT = (2, 2, 1, 1), (66, 50, 50, 50)
_STRICT_SIZE, _STRICT_PCT = (4, 3, 2, 2), (75, 66, 66, 66)

Ngram = tuple[int, int, int, int]
Cache = dict[Ngram, dict[int, int]]


class NgramCacheError(ValueError):
    """A lookup cache file that cannot be read."""


def _ngram(get, start: int, size: int) -> Ngram:
    toks = [get(j) for j in range(start, start + size)] + [_NULL] * (NGRAM_MAX - size)
    return (toks[0], toks[1], toks[2], toks[3])


def update_cache(cache: Cache, inp: list[int], n_new: int) -> None:
    """Count the followers of every 1..4-gram that ends in the last `n_new` tokens of `inp`."""
    n = len(inp)
    for size in range(NGRAM_MIN, NGRAM_MAX + 1):
        for i in range(max(n - n_new, size), n):
            part = cache.setdefault(_ngram(inp.__getitem__, i - size, size), {})
            part[inp[i]] = part.get(inp[i], 0) + 1


def merge_cache(target: Cache, add: Cache) -> None:
    for ngram, part in add.items():
        dst = target.setdefault(ngram, {})
        for tok, count in part.items():
            dst[tok] = dst.get(tok, 0) + count


def _try_primary(primary: Cache, ngrams: list[Ngram], static: dict[int, int], sizes, pcts) -> int:
    for i in range(len(ngrams) - 1, -1, -1):  # the longest n-gram first
        part = primary.get(ngrams[i])
        if not part:
            continue
        best, best_p, best_s, total = _NULL, 0, 0, 0
        for tok, count in part.items():
            count_s = 100 * static[tok] if tok in static else 1
            if count * count_s > best_p * best_s:
                best, best_p, best_s = tok, count, count_s
            total += count
        if total < sizes[i] or 100 * best_p < pcts[i] * total:
            continue
        return best
    return _NULL


def _try_static(static: Cache, ngram: Ngram) -> int:
    part = static.get(ngram)
    if not part:
        return _NULL
    best, best_count, total = _NULL, 0, 0
    for tok, count in part.items():
        if count > best_count:
            best, best_count = tok, count
        total += count
    if total < _LAX_SIZE[NGRAM_STATIC - 1] or 100 * best_count < _LAX_PCT[NGRAM_STATIC - 1] * total:
        return _NULL
    return best


def draft_from_caches(
    inp: list[int], n_draft: int, context: Cache, dynamic: Cache, static: Cache
) -> list[int]:
    """llama.cpp's common_ngram_cache_draft: up to `n_draft` tokens to follow `inp`."""
    out: list[int] = []
    n = len(inp)
    if n < NGRAM_STATIC:
        return out

    def get(i: int) -> int:
        return inp[i] if i < n else out[i - n]

    while len(out) < n_draft:
        ngram_s = _ngram(get, n - NGRAM_STATIC + len(out), NGRAM_STATIC)
        part_s = static.get(ngram_s, {})
        ngrams = [_ngram(get, n - size + len(out), size) for size in range(NGRAM_MIN, NGRAM_MAX + 1)]
        tok = _try_primary(context, ngrams, part_s, _LAX_SIZE, _LAX_PCT)
        if tok == _NULL:
            tok = _try_primary(dynamic, ngrams, part_s, _STRICT_SIZE, _STRICT_PCT)
        if tok == _NULL:
            tok = _try_static(static, ngram_s)
        if tok == _NULL:
            break
        out.append(tok)
    return out


def load_ngram_cache(path: str | os.PathLike[str]) -> Cache:
    """Read a lookup cache file; NgramCacheError when it is missing or malformed."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise NgramCacheError(f"cannot read lookup cache {path}: {e.strerror or e}") from None
    cache: Cache = {}
    off, end = 0, len(data)
    head, pair = struct.Struct("<5i"), struct.Struct("<2i")
    while off < end:
        if off + head.size > end:
            raise NgramCacheError(f"lookup cache {path} is truncated at byte {off}")
        *toks, n_tok = head.unpack_from(data, off)
        off += head.size
        if n_tok <= 0 or off + n_tok * pair.size > end:
            raise NgramCacheError(f"lookup cache {path} is malformed at byte {off}")
        part: dict[int, int] = {}
        for tok, count in pair.iter_unpack(data[off : off + n_tok * pair.size]):
            if count <= 0:
                raise NgramCacheError(f"lookup cache {path} has a non-positive count at byte {off}")
            part[tok] = count
        off += n_tok * pair.size
        cache[(toks[0], toks[1], toks[2], toks[3])] = part
    return cache


def save_ngram_cache(cache: Cache, path: str | os.PathLike[str]) -> None:
    """Write a lookup cache file atomically (temp file in the same directory, fsync, rename)."""
    dst = Path(path)
    chunks = []
    for ngram, part in cache.items():
        if not part:
            continue
        chunks.append(struct.pack("<5i", *ngram, len(part)))
        chunks.append(b"".join(struct.pack("<2i", t, c) for t, c in part.items()))
    fd, tmp = tempfile.mkstemp(prefix=dst.name + ".", suffix=".tmp", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"".join(chunks))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(slots=True)
class _SeqCache:
    context: Cache = field(default_factory=dict)
    n_seen: int = 0  # tokens of the history counted so far
    learn: bool = True  # merged into the dynamic cache afterwards (only text of the unscoped server)


class NgramCache:
    """The ngram-cache drafter; `static_path` / `dynamic_path` are the -lcs / -lcd files ("": none)."""

    def __init__(self, static_path: str = "", dynamic_path: str = "") -> None:
        self.n_max = NGRAM_CACHE_N_DRAFT
        self.static: Cache = load_ngram_cache(static_path) if static_path else {}
        self.dynamic_path = dynamic_path
        self.dynamic: Cache = {}
        if dynamic_path and Path(dynamic_path).exists():
            self.dynamic = load_ngram_cache(dynamic_path)
        self._seqs: defaultdict[int, _SeqCache] = defaultdict(_SeqCache)

    def begin(self, seq: int, prompt: list[int], scope: str = "") -> None:
        old = self._seqs.pop(seq, None)
        if old is not None and old.learn and self.dynamic_path:  # what it taught goes to the dynamic cache
            merge_cache(self.dynamic, old.context)
        # the dynamic cache drafts for every caller: with API keys it learns from none of them
        self._seqs[seq] = _SeqCache(learn=not scope)

    def draft(self, jobs: list[DraftJob]) -> None:
        for job in jobs:
            sc = self._seqs[job.seq]
            inp = [*job.tokens, job.last]
            if sc.n_seen > len(inp):  # the history was cut (context shift): count it again
                sc.context, sc.n_seen = {}, 0
            update_cache(sc.context, inp, len(inp) - sc.n_seen)
            sc.n_seen = len(inp)
            job.result = draft_from_caches(inp, self.n_max, sc.context, self.dynamic, self.static)

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        pass

    def close(self) -> None:
        """Write the dynamic cache back to its `-lcd` file (only when one was given)."""
        if not self.dynamic_path:
            return
        for sc in self._seqs.values():
            if sc.learn:
                merge_cache(self.dynamic, sc.context)
        self._seqs.clear()
        save_ngram_cache(self.dynamic, self.dynamic_path)
