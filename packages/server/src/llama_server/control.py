"""Chat completions that can be controlled while they run (`/v1/chat/completions/control`, endpoints.md §5.4).

llama-server finds the running slot of a completion id and, for `reasoning_end`, forces the reasoning
budget's closing sequence (common_sampler_reasoning_budget_force): the thinking block ends at the next
token and the answer follows. Only a request sent with `reasoning_control: true` to a template with
thinking tags is armed. The answer is `success: true` whenever such a request holds a slot, even when it
is not thinking (then nothing changes), as llama-server's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llama_engine import RequestHandle

__all__ = ["LiveCompletions"]

NOT_ACTIVE = "no active completion for this id"
NOT_ARMED = "reasoning control not enabled for this completion"


@dataclass(slots=True)
class LiveCompletions:
    """Running chat completions by id: their engine handles and whether reasoning control is armed."""

    _runs: dict[str, tuple[list[RequestHandle], bool]] = field(default_factory=dict)

    def add(self, cmpl_id: str, handles: list[RequestHandle], armed: bool) -> None:
        """Track a completion's handles (finished ones are forgotten here, so the table stays small)."""
        self._prune()
        self._runs[cmpl_id] = (handles, armed)

    def _prune(self) -> None:
        for k in [k for k, (hs, _) in self._runs.items() if all(h.final is not None for h in hs)]:
            del self._runs[k]

    def end_reasoning(self, cmpl_id: str) -> tuple[bool, str]:
        """(success, message) of a `reasoning_end` action on this completion id."""
        self._prune()
        handles, armed = self._runs.get(cmpl_id, ([], False))
        # llama-server: the first slot processing this id (a request still queued holds none)
        live = next((h for h in handles if h.final is None and h.sampler is not None), None)
        if live is None:
            return False, NOT_ACTIVE
        if not armed or not live.end_reasoning():
            return False, NOT_ARMED
        return True, ""
