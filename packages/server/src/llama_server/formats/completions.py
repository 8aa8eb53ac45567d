"""OpenAI's legacy `/v1/completions` responses, `text_completion` (endpoints.md §4)."""

from __future__ import annotations

from msgspec import UNSET, Struct, UnsetType, field
from msgspec.structs import replace

from llama_engine import FinalEvent, ProgressEvent, TokenEvent
from llama_engine.tokenizer import Tokenizer

from ..generation import (
    ApiTimings,
    ApiUsage,
    Choice,
    LogprobsContent,
    finish_reason,
    timings_out,
    usage_of,
)
from ..sse import DONE
from ..state import BUILD_INFO
from ..streaming import Formatter
from .native import NativeChunk, NativeResult
from .progress import PromptProgress, progress_out
from .verbose import Verbose

__all__ = ["CompletionChoice", "CompletionsFormatter", "TextCompletion"]


class CompletionChoice(Struct, gc=False):
    text: str
    index: int
    logprobs: LogprobsContent | None
    finish_reason: str | None


class TextCompletion(Struct, gc=False):
    """The body, and every stream chunk (the last one with `usage`)."""

    choices: list[CompletionChoice]
    created: int
    model: str
    system_fingerprint: str
    object: str
    usage: ApiUsage | UnsetType = UNSET
    id: str = ""
    timings: ApiTimings | UnsetType = UNSET
    verbose: NativeChunk | NativeResult | UnsetType = field(default=UNSET, name="__verbose")
    prompt_progress: PromptProgress | UnsetType = UNSET  # a return_progress update


class CompletionsFormatter(Formatter):
    done = DONE

    def __init__(
        self,
        tok: Tokenizer,
        *,
        id: str,
        created: int,
        model: str,
        n_probs: int,
        post: bool,
        special: bool = False,
        verbose: Verbose | None = None,
    ) -> None:
        super().__init__(tok, n_probs, post, special)
        self.verbose = verbose
        # what every chunk shares
        self.head = TextCompletion([], created, model, BUILD_INFO, "text_completion", id=id)

    def token(self, index: int, ev: TokenEvent) -> list[TextCompletion]:
        native = self.verbose.chunk(index, ev) if self.verbose is not None else UNSET
        probs = self.probs(ev)  # as llama-server: a chunk per token, empty while text is held back
        lp = LogprobsContent([probs]) if probs is not None else None
        tm = timings_out(ev.timings) if ev.timings is not None else UNSET
        choice = CompletionChoice(ev.text, index, lp, None)
        return [replace(self.head, choices=[choice], timings=tm, verbose=native)]

    def progress(self, index: int, ev: ProgressEvent) -> list[TextCompletion]:
        tm = timings_out(ev.timings) if ev.timings is not None else UNSET
        choice = CompletionChoice("", index, None, None)
        return [replace(self.head, choices=[choice], timings=tm, prompt_progress=progress_out(ev))]

    def final(self, index: int, ev: FinalEvent) -> list[TextCompletion]:
        out = [replace(self.head, choices=[CompletionChoice(ev.text, index, None, None)])] if ev.text else []
        last = CompletionChoice("", index, None, finish_reason(ev))
        native = self.verbose.final(index, ev) if self.verbose is not None else UNSET
        usage, tm = usage_of([ev]), timings_out(ev.timings)
        out.append(replace(self.head, choices=[last], usage=usage, timings=tm, verbose=native))
        return out

    def result(self, choices: list[Choice]) -> TextCompletion:
        finals = [c.final for c in choices if c.final is not None]
        out = [
            CompletionChoice(
                c.text,
                c.index,
                LogprobsContent(c.probs) if self.n_probs > 0 else None,
                finish_reason(c.final),
            )
            for c in choices
        ]
        native = self.verbose.result(choices[0]) if self.verbose is not None else UNSET
        usage, tm = usage_of(finals), timings_out(finals[0].timings)
        return replace(self.head, choices=out, usage=usage, timings=tm, verbose=native)
