"""llama.cpp's native `/completion` (and `/infill`) responses (endpoints.md §3)."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

from llama_engine import FinalEvent, GenerationRequest, ProgressEvent, StopReason, TokenEvent
from llama_engine.tokenizer import Tokenizer

from ..generation import ApiTimings, Choice, Probs, stop_type, timings_out
from ..streaming import Formatter
from .progress import PromptProgress, progress_out

__all__ = ["NativeChunk", "NativeFormatter", "NativeResult"]


class NativeChunk(Struct, gc=False):
    """One streamed token (`stop: false`)."""

    index: int
    content: str
    tokens: list[int]
    stop: bool
    id_slot: int
    tokens_predicted: int
    tokens_evaluated: int
    timings: ApiTimings | UnsetType = UNSET  # with timings_per_token
    prompt_progress: PromptProgress | UnsetType = UNSET  # a return_progress update
    completion_probabilities: list[Probs] | UnsetType = UNSET


class NativeResult(Struct, gc=False):
    """A finished request: the non-streamed body, and a stream's last event (`content` empty)."""

    index: int
    content: str
    tokens: list[int]
    id_slot: int
    stop: bool
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    generation_settings: dict[str, Any]
    prompt: str
    has_new_line: bool
    truncated: bool
    stop_type: str
    stopping_word: str
    tokens_cached: int
    timings: ApiTimings
    completion_probabilities: list[Probs] | UnsetType = UNSET


class NativeFormatter(Formatter):
    """`reqs[i]` is choice i's engine request, `settings[i]` its `generation_settings`."""

    def __init__(
        self,
        tok: Tokenizer,
        reqs: list[GenerationRequest],
        settings: list[dict[str, Any]],
        model: str,
        *,
        n_probs: int,
        post: bool,
        special: bool = False,
        return_tokens: bool = False,
        response_fields: list[str] | None = None,
    ) -> None:
        super().__init__(tok, n_probs, post, special)
        self.reqs = reqs
        self.settings = settings
        self.model = model
        self.return_tokens = return_tokens
        self.fields = response_fields
        self.counts = [0] * len(reqs)
        self.newline = [False] * len(reqs)

    def _chunk(self, i: int, text: str, tokens: list[int]) -> NativeChunk:
        self.newline[i] = self.newline[i] or "\n" in text
        return NativeChunk(i, text, tokens, False, -1, self.counts[i], len(self.reqs[i].prompt))

    def token(self, index: int, ev: TokenEvent) -> list[NativeChunk]:
        self.counts[index] += 1
        chunk = self._chunk(index, ev.text, [ev.token])
        if ev.timings is not None:  # asked for with timings_per_token
            chunk.timings = timings_out(ev.timings)
        probs = self.probs(ev)
        if probs is not None:
            chunk.completion_probabilities = [probs]
        return [chunk]

    def progress(self, index: int, ev: ProgressEvent) -> list[NativeChunk]:
        chunk = self._chunk(index, "", [0])  # llama-server's progress update is an empty token output (id 0)
        if ev.timings is not None:
            chunk.timings = timings_out(ev.timings)
        chunk.prompt_progress = progress_out(ev)
        return [chunk]

    def final(self, index: int, ev: FinalEvent) -> list[Struct]:
        out: list[Struct] = [self._chunk(index, ev.text, [])] if ev.text else []
        out.append(self.streamed_result(index, ev))
        return out

    def streamed_result(self, index: int, ev: FinalEvent) -> NativeResult:
        """A stream's last event: the final result without content or tokens (they were streamed)."""
        return self._result(index, ev, "", [], self.newline[index], UNSET)

    def result(self, choices: list[Choice]) -> Any:
        results: list[Any] = [self.full_result(c) for c in choices]
        if self.fields:
            results = [_select(msgspec.to_builtins(r), self.fields) for r in results]
        return results[0] if len(results) == 1 else results

    def full_result(self, c: Choice) -> NativeResult:
        """The non-streamed result of one choice."""
        f = c.final
        assert f is not None
        probs: list[Probs] | UnsetType = UNSET
        if self.n_probs > 0:
            probs = c.probs
            if f.reason == StopReason.STOP_WORD and probs:  # the stop word's tokens carry no entry
                n_stop = len(self.tok.encode(f.stop_word, add_special=False))
                probs = probs[: max(len(probs) - n_stop, 0)]
        tokens = c.tokens if self.return_tokens else []
        text = c.text
        return self._result(c.index, f, text, tokens, "\n" in text, probs)

    def _result(
        self,
        i: int,
        f: FinalEvent,
        text: str,
        tokens: list[int],
        newline: bool,
        probs: list[Probs] | UnsetType,
    ) -> NativeResult:
        u = f.usage
        return NativeResult(
            index=i,
            content=text,
            tokens=tokens,
            id_slot=f.slot,
            stop=True,
            model=self.model,
            tokens_predicted=u.completion_tokens,
            tokens_evaluated=u.prompt_tokens,
            generation_settings=self.settings[i],
            prompt=self.tok.decode(self.reqs[i].prompt),
            has_new_line=newline,
            truncated=f.truncated,
            stop_type=stop_type(f),
            stopping_word=f.stop_word,
            tokens_cached=u.prompt_tokens + max(u.completion_tokens - 1, 0),
            timings=timings_out(f.timings),
            completion_probabilities=probs,
        )


def _select(obj: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """`response_fields`: only the listed paths, `a/b` a nested one, each under its literal path."""
    out: dict[str, Any] = {}
    for path in fields:
        cur: Any = obj
        for part in path.split("/"):
            if not isinstance(cur, dict) or part not in cur:
                break
            cur = cur[part]
        else:
            out[path] = cur
    return out
