"""Results of generation requests: accumulating events, and the JSON pieces every format shares
(`timings`, probabilities, stop types, ids)."""

from __future__ import annotations

import math
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from llama_engine import FinalEvent, StopReason, Timings, TokenEvent
from llama_engine.tokenizer import Tokenizer

__all__ = [
    "Choice",
    "collect",
    "completion_id",
    "finish_reason",
    "prob_entry",
    "random_id",
    "stop_type",
    "timings_json",
]

_ALNUM = string.ascii_letters + string.digits
LOGPROB_ZERO = -3.4028234663852886e38  # ln(0) reported as the most negative finite float32


def random_id(n: int = 32) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


def completion_id() -> str:
    return "chatcmpl-" + random_id()


@dataclass(slots=True)
class Choice:
    """Everything one engine request produced."""

    index: int
    content: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    probs: list[dict[str, Any]] = field(default_factory=list)
    final: FinalEvent | None = None

    @property
    def text(self) -> str:
        return "".join(self.content)


def stop_type(final: FinalEvent | None) -> str:
    if final is None:
        return "none"
    return {StopReason.EOS: "eos", StopReason.STOP_WORD: "word", StopReason.LENGTH: "limit"}.get(
        final.reason, "none"
    )


def finish_reason(final: FinalEvent | None, tool_calls: bool = False) -> str | None:
    if final is None:
        return None
    if final.reason == StopReason.LENGTH:
        return "length"
    return "tool_calls" if tool_calls else "stop"


def timings_json(t: Timings) -> dict[str, Any]:
    """llama.cpp's `timings` object (endpoints.md §2.3): all finite, >= 0."""
    prompt_ms = max(t.prompt_ms, 0.0)
    predicted_ms = max(t.predicted_ms, 0.001 if t.predicted_n else 0.0)
    return {
        "cache_n": t.cache_n,
        "prompt_n": t.prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / t.prompt_n if t.prompt_n else 0.0,
        "prompt_per_second": 1e3 / prompt_ms * t.prompt_n if prompt_ms > 0 else 0.0,
        "predicted_n": t.predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / (t.predicted_n - 1) if t.predicted_n > 1 else 0.0,
        "predicted_per_second": 1e3 / predicted_ms * (t.predicted_n - 1) if t.predicted_n > 1 else 0.0,
    }


def _piece(tok: Tokenizer, token: int) -> tuple[str, list[int]]:
    raw = tok.token_to_piece(token, special=True)
    text = raw.decode("utf-8", "ignore") if raw else ""
    # the longest valid UTF-8 prefix
    for cut in range(len(raw), max(len(raw) - 4, -1), -1):
        try:
            text = raw[:cut].decode("utf-8")
            break
        except UnicodeDecodeError:
            continue
    return text, list(raw)


def _logprob(p: float) -> float:
    return math.log(p) if p > 0 else LOGPROB_ZERO


def prob_entry(tok: Tokenizer, ev: TokenEvent, post_sampling: bool) -> dict[str, Any]:
    """One entry of `completion_probabilities` / `logprobs.content` (endpoints.md §2.4)."""
    text, raw = _piece(tok, ev.token)
    top = []
    for tid, p in ev.top:
        t_text, t_raw = _piece(tok, tid)
        if post_sampling:
            if p > 0:
                top.append({"id": tid, "token": t_text, "bytes": t_raw, "prob": p})
        else:
            top.append({"id": tid, "token": t_text, "bytes": t_raw, "logprob": _logprob(p)})
    if post_sampling:
        return {"id": ev.token, "token": text, "bytes": raw, "prob": ev.prob, "top_probs": top}
    return {"id": ev.token, "token": text, "bytes": raw, "logprob": _logprob(ev.prob), "top_logprobs": top}


def add_event(choice: Choice, ev: TokenEvent | FinalEvent, tok: Tokenizer, n_probs: int, post: bool) -> None:
    """Fold one event into a non-streamed result."""
    if isinstance(ev, TokenEvent):
        choice.content.append(ev.text)
        choice.tokens.append(ev.token)
        if n_probs > 0 and ev.top:
            choice.probs.append(prob_entry(tok, ev, post))
    else:
        choice.final = ev
        if ev.text:
            choice.content.append(ev.text)


async def collect(run: Any, tok: Tokenizer, n_probs: int, post: bool) -> list[Choice]:
    """Every choice of a run, once all are final."""
    choices = [Choice(i) for i in range(run.n)]
    async for item in run.events():
        if item is not None:
            index, ev = item
            add_event(choices[index], ev, tok, n_probs, post)
    return choices
