"""The host-RAM prompt cache (llama-server's ``server_prompt_cache``, ``--cache-ram N``).

A slot's cache (its tokens, a copy of its KV cells and its context checkpoints) is saved to host memory
before the slot's cells are given to a prompt that keeps little of them, and idle slots are saved when
a new request starts (``--cache-idle-slots``; with a unified KV cache they are then cleared, which frees
their cells for the running requests). A new request whose prompt matches a saved state better than its
slot's cache gets that state loaded into its slot first. Entries are dropped oldest first to stay
under the size limit; a state contained in a newer one is dropped when that one is saved. An entry
keeps the scope (API key) its tokens were computed for and serves, contains or is contained in only
states of that scope.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from .checkpoints import Checkpoint, Checkpoints
from .kv_cache import KVCache, KVCacheFullError
from .slot import Slot, SlotState, common_prefix

__all__ = ["CachedPrompt", "PromptCache"]

log = logging.getLogger("llama_engine")

_MIB = 1024 * 1024


@dataclass(slots=True, eq=False)
class CachedPrompt:
    """One saved slot cache: its tokens, its adapter key, its cells per pool, its checkpoints and the
    scope it belongs to."""

    tokens: list[int]
    lora: tuple[float, ...]
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    checkpoints: list[Checkpoint] = field(default_factory=list)
    scope: str = ""

    def serves(self, lora: tuple[float, ...], scope: str) -> bool:
        """Whether a request under these adapters and of this scope may reuse the entry."""
        return self.lora == lora and self.scope == scope

    @property
    def nbytes(self) -> int:
        cells = sum(a.nbytes for part in self.parts for a in part)
        return cells + sum(c.nbytes for c in self.checkpoints)


class PromptCache:
    """Saved slot caches, oldest first, under ``limit_mib`` MiB (< 0: no limit)."""

    def __init__(self, kv: KVCache, limit_mib: int, idle_slots: bool = True, clear_idle: bool = True) -> None:
        self.kv = kv
        self.limit = 0 if limit_mib < 0 else limit_mib * _MIB  # 0: no limit
        self.idle_slots = idle_slots  # save idle slots when a request starts
        self.clear_idle = clear_idle  # and then clear them (a unified KV cache: their cells serve others)
        self.states: list[CachedPrompt] = []
        limit = "no limit" if self.limit == 0 else f"{limit_mib} MiB"
        log.info("prompt cache is enabled, size limit: %s", limit)
        if idle_slots:
            when = " and cleared" if clear_idle else ""
            log.info("idle slots will be saved to prompt cache%s upon starting a new task", when)
            log.debug("__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__")  # llama-server's marker for its tests

    # -- the scheduler's two calls -----------------------------------------------------------------------

    def before_start(
        self, slot: Slot, prompt: list[int], key: tuple[float, ...], ckpts: Checkpoints, scope: str = ""
    ) -> None:
        """A request of ``scope`` takes ``slot``: if that would keep under half of the slot's cache (all of
        it when the cache is another scope's), save the cache first, then load the saved state of
        ``scope`` that serves ``prompt`` better, if any."""
        own = slot.tokens if slot.lora == key and slot.scope == scope else []
        if own and common_prefix(own, prompt) >= 0.5 * len(own):
            return
        log.debug("updating prompt cache")
        self.save(slot.id, slot.tokens, slot.lora, ckpts.of(slot.id), slot.scope)
        entry = self.best(own, key, prompt, scope)
        if entry is not None and self.load(slot.id, entry):
            slot.tokens, slot.lora, slot.scope = list(entry.tokens), entry.lora, entry.scope
            ckpts.replace(slot.id, entry.checkpoints)

    def after_start(self, slots: list[Slot], ckpts: Checkpoints) -> None:
        """A request started: save the idle slots (``--cache-idle-slots``), clearing them if asked."""
        if not self.idle_slots:
            return
        for s in slots:
            if s.state != SlotState.IDLE or not s.tokens:
                continue
            if self.save(s.id, s.tokens, s.lora, ckpts.of(s.id), s.scope):
                log.debug("slot %d: __TEST_TAG_CACHE_IDLE_SLOT__", s.id)
            if self.clear_idle:
                self.kv.seq_rm(s.id)
                ckpts.clear(s.id)
                s.tokens = []

    # -- entries -----------------------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.states)

    @property
    def n_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.states)

    def save(
        self,
        seq: int,
        tokens: list[int],
        lora: tuple[float, ...],
        checkpoints: list[Checkpoint],
        scope: str = "",
    ) -> bool:
        """Copy sequence ``seq``'s cache, ``scope``'s, into the cache (not when a saved state of that scope
        already holds it all: another scope's copy of the same tokens does not serve this one)."""
        if not tokens:
            return False
        for s in self.states:
            if s.serves(lora, scope) and common_prefix(s.tokens, tokens) == len(tokens):
                return False  # already in the cache
        entry = CachedPrompt(list(tokens), lora, self.kv.seq_export(seq), list(checkpoints), scope)
        size = entry.nbytes
        if self.limit and size > self.limit:
            log.warning(
                "prompt cache: state size %.3f MiB exceeds the limit %.3f MiB, skipping",
                size / _MIB,
                self.limit / _MIB,
            )
            return False
        # states this one contains are obsolete
        self.states = [
            s
            for s in self.states
            if not (s.serves(lora, scope) and common_prefix(s.tokens, tokens) == len(s.tokens))
        ]
        while self.states and self.limit and self.nbytes + size > self.limit:
            old = self.states.pop(0)
            log.info("prompt cache: making room, removing the oldest entry (%.3f MiB)", old.nbytes / _MIB)
        self.states.append(entry)
        self._limit_tokens()
        log.info(
            "prompt cache: saved slot %d, %d tokens, %.3f MiB (%d states, %.3f MiB)",
            seq,
            len(tokens),
            size / _MIB,
            len(self.states),
            self.nbytes / _MIB,
        )
        return True

    def _limit_tokens(self) -> None:
        """Keep at most a context's worth of tokens, or as many as the size limit holds at the current
        bytes per token when that is more (llama-server's token limit)."""
        limit = self.kv.n_ctx
        if self.limit:
            per_token = max(1.0, self.nbytes / max(1, self.n_tokens))
            limit = max(limit, int(self.limit / per_token))
        while len(self.states) > 1 and self.n_tokens > limit:
            self.states.pop(0)

    def best(
        self, cached: list[int], lora: tuple[float, ...], prompt: list[int], scope: str = ""
    ) -> CachedPrompt | None:
        """The saved state of ``scope`` that keeps more of itself and matches more of ``prompt`` than the
        slot's own cache ``cached`` (llama-server's f_keep / f_sim rule; states that would keep under a
        quarter of themselves are not used)."""
        lcp = common_prefix(cached, prompt)
        f_keep = lcp / len(cached) if cached else -1.0
        f_sim = lcp / max(len(prompt), 1)
        found = None
        for s in self.states:
            if not s.serves(lora, scope):
                continue
            n = common_prefix(s.tokens, prompt)
            keep, sim = n / len(s.tokens), n / max(len(prompt), 1)
            if keep >= 0.25 and keep > f_keep and sim > f_sim:
                f_keep, f_sim, found = keep, sim, s
        return found

    def load(self, seq: int, entry: CachedPrompt) -> bool:
        """Replace ``seq``'s cells by the saved state's (it leaves the cache); False when they do not fit."""
        try:
            self.kv.seq_import(seq, entry.parts)
        except KVCacheFullError as e:
            log.warning("prompt cache: failed to load a state into slot %d: %s", seq, e)
            return False
        self.states.remove(entry)
        log.info("prompt cache: loaded %d tokens into slot %d", len(entry.tokens), seq)
        return True
