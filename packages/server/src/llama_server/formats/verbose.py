"""`__verbose`: llama-server's debug copy of the native result on OpenAI-compatible responses.

llama-server run with `-v` (verbosity above 9), or a request with `"verbose": true`, adds to each
`/v1/completions` and `/v1/chat/completions` result the native `/completion` object of the same generation
(endpoints.md §2.1, §5.2-5.3): the non-streamed body and a stream's final chunk carry the final native
result (`content` empty when streamed, as the tokens were sent already); each streamed `/v1/completions`
chunk also carries the native token chunk. Anthropic and Responses bodies carry none (as llama-server).
"""

from __future__ import annotations

from typing import Any

from llama_engine import FinalEvent, GenerationRequest, TokenEvent
from llama_engine.tokenizer import Tokenizer

from ..config import ServerConfig
from ..controllers._common import generation_settings
from ..generation import Choice
from .native import NativeChunk, NativeFormatter, NativeResult

__all__ = ["Verbose", "verbose_for"]


class Verbose:
    """The native counterpart of one OpenAI-compatible response (one `NativeFormatter` fed alongside)."""

    def __init__(
        self,
        tok: Tokenizer,
        reqs: list[GenerationRequest],
        stream: bool,
        model: str,
        *,
        n_probs: int,
        post: bool,
        special: bool = False,
    ) -> None:
        settings = [generation_settings(r, stream, eog_ids=tok.eog_ids) for r in reqs]
        self._native = NativeFormatter(
            tok, reqs, settings, model, n_probs=n_probs, post=post, special=special
        )

    def chunk(self, index: int, ev: TokenEvent) -> NativeChunk:
        """A streamed token's native chunk."""
        return self._native.token(index, ev)[0]

    def final(self, index: int, ev: FinalEvent) -> NativeResult:
        """A stream's final native result: no content or tokens (they were streamed)."""
        return self._native.streamed_result(index, ev)

    def result(self, choice: Choice) -> NativeResult:
        """The non-streamed native result of one choice."""
        return self._native.full_result(choice)


def verbose_for(
    body: Any,
    config: ServerConfig,
    tok: Tokenizer,
    reqs: list[GenerationRequest],
    model: str,
    n_probs: int,
) -> Verbose | None:
    """A `Verbose` when the request's `verbose` (default: the server's `-v`) asks for `__verbose`."""
    on = body.verbose if body.verbose is not None else config.verbose
    if not on:
        return None
    post = bool(body.post_sampling_probs)
    return Verbose(tok, reqs, bool(body.stream), model, n_probs=n_probs, post=post, special=config.special)
