"""`LLM`: the library API for people who import the engine.

from llama_engine import LLM

llm = LLM("model.gguf", n_ctx=4096, n_parallel=4)
ids = llm.tokenize("Hello")
for token in llm.generate("The capital of France is", max_tokens=16, temperature=0):
    print(llm.detokenize([token]), end="")
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .engine import Engine, EngineConfig
from .requests import EmbeddingRequest, FinalEvent, GenerationRequest, Pooling, TokenEvent
from .sampling import SamplingParams

__all__ = ["LLM"]


class LLM:
    """A loaded model with its engine thread. Use as a context manager, or call `close()`."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_parallel: int = 1,
        n_batch: int = 512,
        warmup: bool = True,
        **config: Any,
    ) -> None:
        cfg = EngineConfig(
            n_ctx=n_ctx, n_parallel=n_parallel, n_batch=n_batch, n_threads=n_threads, warmup=warmup, **config
        )
        self.engine = Engine(path, cfg).start()
        self.engine.wait_ready()
        self.tokenizer = self.engine.tokenizer
        self.last: FinalEvent | None = None

    # -- text <-> tokens ---------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids as llama.cpp's llama_tokenize; special-token text is literal unless parse_special."""
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    # -- generation --------------------------------------------------------------------------------------

    def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 128,
        temperature: float = 0.8,
        seed: int = -1,
        ignore_eos: bool = False,
        stop: Sequence[str] = (),
        **sampling: Any,
    ) -> Iterator[int]:
        """Yield generated token ids. `prompt` is text (tokenized with BOS as the model wants, special
        tokens parsed as in llama.cpp's completion) or token ids. Extra keywords are SamplingParams."""
        ids = self.tokenize(prompt, parse_special=True) if isinstance(prompt, str) else list(prompt)
        params = SamplingParams(
            temperature=temperature, seed=seed if seed >= 0 else 0xFFFFFFFF, ignore_eos=ignore_eos, **sampling
        )
        req = GenerationRequest(prompt=ids, max_tokens=max_tokens, sampling=params, stop=list(stop))
        handle = self.engine.submit(req)
        try:
            for ev in handle:
                if isinstance(ev, TokenEvent):
                    if not ignore_eos and self.tokenizer.is_eog(ev.token):
                        continue  # the end-of-generation token (its FinalEvent follows): not part of the text
                    yield ev.token
                elif isinstance(ev, FinalEvent):  # progress events only come to return_progress requests
                    self.last = ev
                    if ev.error:
                        raise RuntimeError(ev.error)
        finally:
            if handle.final is None:
                handle.cancel()

    def complete(self, prompt: str | Sequence[int], **kw: Any) -> str:
        """The generated text of `generate` as one string."""
        return self.detokenize(list(self.generate(prompt, **kw)))

    def embed(self, text: str | Sequence[int], pooling: str = "mean", normalize: int = 2) -> np.ndarray:
        """A pooled embedding of the text (mean, cls, last or none), normalized (2 = euclidean)."""
        ids = self.tokenize(text) if isinstance(text, str) else list(text)
        return self.engine.embed(
            EmbeddingRequest(prompt=ids, pooling=Pooling[pooling.upper()], normalize=normalize)
        )

    def close(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
