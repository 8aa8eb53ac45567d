"""The first start: compile what a loaded model runs, in parallel processes, before it serves.

``warm_up(engine)`` first replays the warm-up (a prompt chunk, a decode step, the default sampler chains)
with compiling forbidden: when every kernel loads from numba's cache (any start after the first) that is
all it does. Otherwise it compiles in child processes at once (``llama_quant.compiling.precompile``), one
job each for the prompt pass, the decode pass and the sampler chains, reporting each kernel as it is
compiled, and then replays the warm-up in this process, which now loads from the cache. Whatever a child
could not compile is compiled here, so a failing child costs time, never correctness.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from llama_quant.compiling import CompileJob, CompileWatch, precompile

from .batch import Batch
from .sampling import Sampler, SamplingParams

if TYPE_CHECKING:
    from .engine import Engine, EngineConfig

__all__ = ["DEFAULT_CHAINS", "warm_sampling", "warm_up"]

# The chains a request without sampling fields runs (llama.cpp's defaults) and greedy decoding.
DEFAULT_CHAINS: tuple[SamplingParams, ...] = (SamplingParams(), SamplingParams(temperature=0.0))

_PROMPT_TOKENS = 12  # a prompt chunk long enough for the many-lane (prompt) kernels
_JOB_CTX = 256  # KV cells a warm-up child allocates: the kernels' types do not depend on it


class _WouldCompile(Exception):
    """Raised from numba's compile event: the warm-up needs a kernel the cache does not hold."""


class _NoCompiling(CompileWatch):
    def on_start(self, event: object) -> None:
        raise _WouldCompile

    def on_end(self, event: object) -> None:  # numba ends the event it could not start
        pass


@contextmanager
def _cached_only() -> Iterator[None]:
    """Fail on the first kernel numba would compile (raised before it starts, so nothing is half done)."""
    with _NoCompiling():
        yield


def warm_up(
    engine: Engine,
    sampling: tuple[SamplingParams, ...] = DEFAULT_CHAINS,
    report: Callable[[str], None] | None = None,
) -> int:
    """Make every kernel of a prompt chunk, a decode step and the ``sampling`` chains ready in this process:
    loaded from the cache, or compiled first (in parallel processes) when the cache lacks them. Returns the
    number of kernels compiled. ``report`` receives progress lines (default: INFO log lines)."""
    try:
        with _cached_only():
            _replay(engine, sampling)
        return 0
    except _WouldCompile:
        pass
    n = precompile(_jobs(engine, sampling), report)
    with CompileWatch() as watch:  # what the children left (none, unless one failed)
        _replay(engine, sampling)
    return n + len(watch.compiled)


def _replay(engine: Engine, sampling: tuple[SamplingParams, ...]) -> None:
    _forward(engine, _PROMPT_TOKENS)
    _forward(engine, 1)
    warm_sampling(engine.model.config.n_vocab, sampling)


def _forward(engine: Engine, n_tokens: int) -> None:
    """One forward pass of ``n_tokens`` on the scratch sequence (one past the slots), then forget it."""
    seq = engine.config.n_parallel
    bos = engine.tokenizer.bos_id if engine.tokenizer.bos_id is not None else 0
    try:
        engine.model.forward(Batch.single([bos] * n_tokens, seq), engine.kv)
    finally:
        engine.kv.seq_rm(seq)


def warm_sampling(n_vocab: int, chains: tuple[SamplingParams, ...] = DEFAULT_CHAINS) -> None:
    """Run each sampler chain on a row of ``n_vocab`` logits as a request does: the prompt through
    ``accept_many``, then sample and accept twice."""
    logits = np.linspace(-3.0, 3.0, n_vocab, dtype=np.float32)
    for params in chains:
        smpl = Sampler(msgspec.structs.replace(params, seed=1), n_vocab)
        smpl.accept_many([1, 2, 3, 1, 2, 3])
        for _ in range(2):
            smpl.accept(smpl.sample(logits))


def _jobs(engine: Engine, sampling: tuple[SamplingParams, ...]) -> list[CompileJob]:
    cfg = dataclasses.replace(engine.config, n_ctx=max(_JOB_CTX, 16 * engine.config.n_parallel), warmup=False)
    path = engine.gguf.path
    return [
        CompileJob("prompt pass", f"{__name__}:_forward_job", (path, cfg, _PROMPT_TOKENS)),
        CompileJob("decode pass", f"{__name__}:_forward_job", (path, cfg, 1)),
        CompileJob("sampling", f"{__name__}:warm_sampling", (engine.model.config.n_vocab, sampling)),
    ]


def _forward_job(path: str, config: EngineConfig, n_tokens: int) -> None:
    """A child's job: load the model (no warm-up) and run one forward pass of ``n_tokens``."""
    from .engine import Engine

    _forward(Engine(path, config), n_tokens)
