"""Cache reuse by KV shifting (llama-server's ``n_cache_reuse`` / ``--cache-reuse N``).

After the common prefix, the new prompt may still contain long runs of the cached tokens further along
(a chat client that dropped an old turn, a document with a paragraph removed). Each run of at least
``n_min`` tokens is moved to its place in the new prompt: the cells between are forgotten and the run's
cells shifted back, their keys re-rotated to the new positions, as in context shift. The result is what
llama.cpp computes (not a recompute: the moved keys saw their old context), and it needs a cache whose
every pool keeps all positions, so models with a windowed pool smaller than the context do not reuse.
"""

from __future__ import annotations

from .kv_cache import KVCache, KVCacheFullError, ShiftK

__all__ = ["can_reuse_chunks", "reuse_chunks"]


def can_reuse_chunks(kv: KVCache) -> bool:
    """Whether shifting cached chunks is possible: no pool forgets positions (no reduced window pool, no
    recurrent state)."""
    return kv.can_shift and all(p.window is None or p.n_cells >= kv.n_ctx for p in kv.pools)


def reuse_chunks(
    kv: KVCache, seq: int, cached: list[int], prompt: list[int], n_past: int, n_min: int, shift_k: ShiftK
) -> int:
    """Shift runs of at least ``n_min`` cached tokens of ``seq`` that follow the common prefix
    (``n_past`` tokens) into their places in ``prompt``; returns the new count of prompt tokens the cache
    holds (the caller drops the cells past it). ``cached[i]`` is the token at position i."""
    head_c = head_p = n_past
    unshared = False
    while head_c < len(cached) and head_p < len(prompt):
        n = 0
        while (
            head_c + n < len(cached) and head_p + n < len(prompt) and cached[head_c + n] == prompt[head_p + n]
        ):
            n += 1
        if n < n_min:
            head_c += 1
            continue
        if not unshared:  # shifted cells must be this sequence's own, not shared with another slot
            try:
                kv.seq_unshare(seq)
            except KVCacheFullError:
                break
            unshared = True
        kv.seq_rm(seq, head_p, head_c)
        kv.seq_add(seq, head_c, head_c + n, head_p - head_c, shift_k)
        head_c += n
        head_p += n
        n_past += n
    return n_past
