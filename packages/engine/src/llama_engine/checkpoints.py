"""Context checkpoints: the state a sequence needs to resume at a prompt position.

A full-attention pool keeps every position of a sequence, so truncating it (``seq_rm``) rolls it back
to any earlier position. A sliding-window pool (gemma3) forgets what fell out of every window, so once
a slot has moved past the window its cache cannot serve a shorter prefix any more: without help a later
request sharing a long prefix recomputes the whole prompt. A checkpoint copies, for each pool that
cannot roll back, the cells a token at position ``n_tokens`` still attends to (for a window of w: the
w - 1 positions before it); restoring it and truncating the other pools resumes the sequence exactly
there, as llama-server's context checkpoints (``server_prompt_checkpoint``) do. A recurrent or hybrid
model's state (``memory.RecurrentPool``) is one more pool that cannot roll back: its part of a
checkpoint is the state itself, as it was before position ``n_tokens``.

When (llama-server's rule without message spans): a prompt is cut into chunks that end ``n_batch`` and
4 tokens before its end, and a checkpoint is taken at those two points and at the request's first chunk
when it starts within ``n_batch`` tokens of the end, at most ``CheckpointConfig.n_max`` per slot; the oldest go first, and checkpoints
closer than ``min_step`` tokens to an earlier one are dropped first when the list is full.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from .kv_cache import CellPool, KVCache, KVCacheFullError
from .memory import RecurrentPool

__all__ = ["DEFAULT_CHECKPOINTS", "Checkpoint", "CheckpointConfig", "Checkpoints"]

log = logging.getLogger("llama_engine")

# a prompt's last chunk is this short, so a checkpoint lands just before its end (llama-server's offsets:
# 4 + n_ubatch and 4 tokens before the end, each at most n_batch; here n_ubatch is n_batch)
_TAIL = 4

PoolPart = tuple[np.ndarray, np.ndarray, np.ndarray]  # positions [n], keys and values [n_layers, n, ...]


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """How many checkpoints a slot keeps (``-ctxcp``; 0: none) and their spacing (``-cms``)."""

    n_max: int = 32
    min_step: int = 8192

    def __post_init__(self) -> None:
        if self.min_step < 0:
            raise ValueError("checkpoint-min-step must be non-negative")


DEFAULT_CHECKPOINTS = CheckpointConfig()  # llama-server's defaults: 32 per slot, 8192 tokens apart


@dataclass(frozen=True, slots=True, eq=False)
class Checkpoint:
    """A sequence's state before position ``n_tokens``: per pool of the cache, the cells it needs
    (None for a pool that rolls back by truncation). ``task`` identifies the request that made it."""

    n_tokens: int
    pos_min: int
    pos_max: int
    task: float
    parts: tuple[PoolPart | None, ...]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for part in self.parts if part is not None for a in part)

    @property
    def mib(self) -> float:
        return self.nbytes / 1024 / 1024


def _lossy(pool: CellPool | RecurrentPool, n_ctx: int) -> bool:
    """Whether the pool forgets positions a shorter prefix needs: recurrent state, or a window smaller
    than the context (``--swa-full`` gives the window pool the whole context: it rolls back like a full
    one)."""
    if isinstance(pool, RecurrentPool):
        return True
    return pool.window is not None and pool.n_cells < n_ctx


class Checkpoints:
    """Every slot's checkpoints, newest last; taken, restored and dropped by the scheduler."""

    def __init__(self, kv: KVCache, config: CheckpointConfig, n_batch: int) -> None:
        self.kv = kv
        self.config = config
        self.n_batch = n_batch
        self._lossy = [_lossy(p, kv.n_ctx) for p in kv.pools]
        self.enabled = config.n_max > 0 and any(self._lossy)
        self._slots: dict[int, list[Checkpoint]] = {}

    def of(self, seq: int) -> list[Checkpoint]:
        """The checkpoints of slot ``seq``, oldest first."""
        return self._slots.get(seq, [])

    @property
    def nbytes(self) -> int:
        """Host memory every slot's checkpoints hold."""
        return sum(c.nbytes for lst in self._slots.values() for c in lst)

    # -- taking ------------------------------------------------------------------------------------------

    def chunk(self, start: int, n: int, n_prompt: int) -> int:
        """The length of the prompt chunk from ``start`` (at most ``n``): it stops where a checkpoint
        is due, so the checkpoint is taken before the next chunk."""
        if not self.enabled:
            return n
        for stop in self._stops(n_prompt):
            if start < stop < start + n:
                return stop - start
        return n

    def _stops(self, n_prompt: int) -> tuple[int, int]:
        """Where a prompt's chunks stop for a checkpoint, the earlier first."""
        return n_prompt - min(self.n_batch, _TAIL + self.n_batch), n_prompt - min(self.n_batch, _TAIL)

    def before_chunk(self, seq: int, task: float, start: int, n: int, n_prompt: int, first: bool) -> None:
        """Take a checkpoint of ``seq`` at ``start`` before a chunk of ``n`` prompt tokens runs, when
        one is due: the chunk starts within a batch of the prompt's end, the cache holds something, and
        it is the request's first chunk or starts at one of the stops `chunk` makes (chunks cut short
        by a busy step's budget take none: a prompt's checkpoints stay few)."""
        if not self.enabled or start <= 0 or n_prompt >= start + n + self.n_batch:
            return
        if not first and start not in self._stops(n_prompt):
            return
        new = self._take(seq, task, start)
        if new is not None:
            self._add(seq, new)

    def _take(self, seq: int, task: float, n_tokens: int) -> Checkpoint | None:
        parts: list[PoolPart | None] = []
        pos_min = n_tokens
        for pool, lossy in zip(self.kv.pools, self._lossy, strict=True):
            if not lossy:
                parts.append(None)
                continue
            if not pool.covers(seq, n_tokens):  # e.g. a state restored into a smaller pool
                return None
            if isinstance(pool, RecurrentPool):  # the state before n_tokens: the whole of it
                parts.append(pool.seq_export(seq))
                continue
            assert pool.window is not None
            pos, k, v = pool.seq_export(seq)
            keep = (pos >= n_tokens - pool.window + 1) & (pos < n_tokens)
            parts.append((pos[keep], k[:, keep], v[:, keep]))
            if keep.any():
                pos_min = min(pos_min, int(pos[keep][0]))
        return Checkpoint(n_tokens, pos_min, n_tokens - 1, task, tuple(parts))

    def _add(self, seq: int, new: Checkpoint) -> None:
        lst = self._slots.setdefault(seq, [])
        n_max, step = self.config.n_max, self.config.min_step
        # when full, first drop checkpoints too close to an earlier one (not those of this request)
        last, i = -1, 0
        while len(lst) + 1 >= n_max and i < len(lst):
            c = lst[i]
            if c.task != new.task and last >= 0 and c.n_tokens <= last + step:
                del lst[i]
                continue
            last, i = c.n_tokens, i + 1
        while len(lst) >= n_max:
            old = lst.pop(0)
            log.warning(
                "slot %d: erasing old context checkpoint (pos_min = %d, pos_max = %d, n_tokens = %d, "
                "size = %.3f MiB)",
                seq,
                old.pos_min,
                old.pos_max,
                old.n_tokens,
                old.mib,
            )
        lst[:] = [c for c in lst if c.n_tokens != new.n_tokens]  # a new one at the same place supersedes
        lst.append(new)
        log.info(
            "slot %d: created context checkpoint %d of %d (pos_min = %d, pos_max = %d, n_tokens = %d, "
            "size = %.3f MiB)",
            seq,
            len(lst),
            n_max,
            new.pos_min,
            new.pos_max,
            new.n_tokens,
            new.mib,
        )

    # -- restoring and dropping --------------------------------------------------------------------------

    def restore(self, seq: int, n: int) -> int:
        """Resume ``seq`` from its newest checkpoint at or before position ``n``; returns the position
        it resumes at (0: none usable, the caller recomputes from the start)."""
        best = next((c for c in reversed(self.of(seq)) if 0 < c.n_tokens <= n), None)
        if best is None:
            return 0
        try:
            for pool, part in zip(self.kv.pools, best.parts, strict=True):
                if part is None:
                    pool.seq_rm(seq, best.n_tokens)
                else:
                    pool.seq_rm(seq)
                    pool.seq_import(seq, *part)
        except KVCacheFullError:
            return 0
        log.info(
            "slot %d: restored context checkpoint (pos_min = %d, pos_max = %d, n_tokens = %d, n_past = %d, "
            "size = %.3f MiB)",
            seq,
            best.pos_min,
            best.pos_max,
            best.n_tokens,
            best.n_tokens,
            best.mib,
        )
        return best.n_tokens

    def adopt(self, seq: int, donor: int) -> None:
        """``seq`` took ``donor``'s prefix: it shares the donor's checkpoints (they are read-only)."""
        self._slots[seq] = list(self.of(donor))

    def replace(self, seq: int, checkpoints: list[Checkpoint]) -> None:
        """``seq``'s cache was replaced by a saved one: these are its checkpoints now."""
        self._slots[seq] = list(checkpoints)

    def keep_below(self, seq: int, n: int) -> None:
        """Drop the checkpoints of ``seq`` past position ``n``: its cache no longer holds that prefix."""
        lst = self._slots.get(seq)
        if lst:
            lst[:] = [c for c in lst if c.n_tokens <= n]

    def clear(self, seq: int) -> None:
        """Free every checkpoint of ``seq`` (its cache was erased or replaced)."""
        self._slots.pop(seq, None)
