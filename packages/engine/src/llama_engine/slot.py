"""A slot: one sequence of the KV cache and the request it is serving."""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .requests import FinalEvent, GenerationRequest, ProgressEvent, TokenEvent
from .sampling import Sampler

__all__ = [
    "NO_REQUEST",
    "Emit",
    "Parked",
    "Slot",
    "SlotState",
    "common_prefix",
    "lora_key",
    "shift_sizes",
]

Emit = Callable[[TokenEvent | ProgressEvent | FinalEvent], None]
NO_REQUEST = threading.Event()  # the cancel event of a slot with no request


class SlotState(enum.IntEnum):
    IDLE = 0
    PROMPT = 1
    GENERATE = 2


@dataclass(slots=True, eq=False)
class Slot:
    """One sequence of the KV cache and the request it is serving."""

    id: int
    tokens: list[int] = field(default_factory=list)  # what the KV cache holds for this sequence, in order
    state: SlotState = SlotState.IDLE
    request: GenerationRequest | None = None
    prompt: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # int32 [n_prompt]
    emit: Emit | None = None
    sampler: Sampler | None = None
    detok: object = None
    next_token: int = -1  # sampled, not yet in the cache
    drafts: list[int] = field(default_factory=list)  # proposed tokens after next_token, to verify
    n_prompt: int = 0
    n_cached: int = 0
    n_generated: int = 0
    n_drafted: int = 0  # drafted tokens verified for the current request
    n_draft_accepted: int = 0  # of those, accepted
    held: str = ""  # text held back: it may be the start of a stop string
    cancelled: threading.Event = NO_REQUEST  # the RequestHandle's
    arrival: float = 0.0  # when the request was submitted
    t_start: float = 0.0  # when it took the slot
    t_prompt_done: float = 0.0
    last_used: float = 0.0
    lora: tuple[float, ...] = ()  # the adapter scales the cached tokens were computed under
    scope: str = ""  # whose cached tokens these are (GenerationRequest.cache_scope); only it reuses them
    truncated: bool = False  # the current request's context shifted or filled up (FinalEvent.truncated)
    parked: Parked | None = None  # a preempted request re-evaluating its cache here before it resumes
    handle: object = None  # the RequestHandle of the current request (preemption queues it again)


@dataclass(slots=True, eq=False)
class Parked:
    """A generating request set aside for one of higher priority (`Scheduler` under the `priority` policy):
    everything its slot held about it but the cache cells. It resumes in any free slot: the cells come
    back from the prompt cache or are computed again, then generation goes on from `next_token` with the
    same sampler (its random state and histories), so the text is the one it would have produced."""

    request: GenerationRequest  # the original request (the resume re-evaluates `tokens` as its prompt)
    tokens: list[int]  # what its cache held
    sampler: Sampler | None
    detok: object
    next_token: int
    n_prompt: int
    n_cached: int
    n_generated: int
    n_drafted: int
    n_draft_accepted: int
    held: str
    t_start: float
    t_prompt_done: float
    truncated: bool

    @classmethod
    def of(cls, s: Slot) -> Parked:
        assert s.request is not None
        return cls(
            s.request, list(s.tokens), s.sampler, s.detok, s.next_token, s.n_prompt, s.n_cached,
            s.n_generated, s.n_drafted, s.n_draft_accepted, s.held, s.t_start, s.t_prompt_done, s.truncated,
        )  # fmt: skip

    def restore(self, s: Slot) -> None:
        """Back into a slot whose cache now holds `tokens`: generating again."""
        s.request, s.sampler, s.detok, s.next_token = self.request, self.sampler, self.detok, self.next_token
        s.n_prompt, s.n_cached, s.n_generated = self.n_prompt, self.n_cached, self.n_generated
        s.n_drafted, s.n_draft_accepted, s.held = self.n_drafted, self.n_draft_accepted, self.held
        s.t_start, s.t_prompt_done, s.truncated = self.t_start, self.t_prompt_done, self.truncated
        s.state = SlotState.GENERATE


def lora_key(scales: tuple[float, ...]) -> tuple[float, ...]:
    """Adapter scales as a batching key: trailing zeros dropped (no adapter and scale 0 are the same)."""
    n = len(scales)
    while n and scales[n - 1] == 0:
        n -= 1
    return tuple(scales[:n])


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64)
    hit = np.flatnonzero(x)
    return int(hit[0]) if len(hit) else n


def shift_sizes(req: GenerationRequest, n_past: int, n_ctx: int, add_bos: bool) -> tuple[int, int]:
    """llama-server's context shift: (n_keep, n_discard). n_keep is the request's (-1: the whole prompt) + 1
    for a BOS, capped at n_ctx - 4; n_discard the request's (0: half of what follows n_keep), clamped to
    [0, n_left - 1]."""
    keep = len(req.prompt) if req.n_keep < 0 else req.n_keep
    n_keep = min(n_ctx - 4, keep + (1 if add_bos else 0))
    n_left = n_past - n_keep
    n_discard = req.n_discard or n_left // 2
    return n_keep, min(max(n_discard, 0), max(0, n_left - 1))
