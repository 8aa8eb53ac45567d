"""The first start: compile what a loaded model runs, in parallel processes, before it serves.

``warm_up(engine)`` first replays the warm-up (a prompt chunk, a decode step, the default sampler chains)
with compiling forbidden: when every kernel loads from numba's cache (any start after the first) that is
all it does. Otherwise it plans: the two forward passes run once more with every kernel the cache lacks
skipped and listed with its argument types (``llama_quant.compiling.plan_compiles``, on a scratch engine:
its outputs are garbage). Each listed kernel is one job, the sampler chains another, and compiling
processes (one per CPU, ``precompile``) take the jobs one at a time, the largest kernels first
(they take longest), reporting each kernel as it is compiled. Then the warm-up replays in
this process, which now loads from the cache. Whatever a process could not compile is compiled here, so
a failing job costs time, never correctness; a pass the plan could not finish becomes one job of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from llama_quant.compiling import (
    CacheMiss,
    CompileJob,
    CompileWatch,
    cached_only,
    code_size,
    plan_compiles,
    precompile,
)

from .batch import Batch
from .sampling import Sampler, SamplingParams

if TYPE_CHECKING:
    from .engine import Engine, EngineConfig

__all__ = ["DEFAULT_CHAINS", "warm_sampling", "warm_up"]

# The chains a request without sampling fields runs (llama.cpp's defaults) and greedy decoding.
DEFAULT_CHAINS: tuple[SamplingParams, ...] = (SamplingParams(), SamplingParams(temperature=0.0))

_PROMPT_TOKENS = 12  # a prompt chunk long enough for the many-lane (prompt) kernels
_CHAINS_SIZE = 6000  # the sampler chains job, in code_size units of kernels taking as long
_JOB_CTX = 256  # KV cells a warm-up child allocates: the kernels' types do not depend on it


def warm_up(
    engine: Engine,
    sampling: tuple[SamplingParams, ...] = DEFAULT_CHAINS,
    report: Callable[[str], None] | None = None,
) -> int:
    """Make every kernel of a prompt chunk, a decode step and the ``sampling`` chains ready in this process:
    loaded from the cache, or compiled first (in parallel processes) when the cache lacks them. Returns the
    number of kernels compiled. ``report`` receives progress lines (default: INFO log lines)."""
    try:
        with cached_only():
            _replay(engine, sampling)
        return 0
    except CacheMiss:
        pass
    n = precompile(lambda: _jobs(engine, sampling), report)  # planned while the processes start
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
    ``accept_many``, then sample and accept twice; then the first chain with probabilities."""
    logits = np.linspace(-3.0, 3.0, n_vocab, dtype=np.float32)
    for params in chains:
        smpl = Sampler(msgspec.structs.replace(params, seed=1), n_vocab)
        smpl.accept_many([1, 2, 3, 1, 2, 3])
        for _ in range(2):
            smpl.accept(smpl.sample(logits))
    # a request's `n_probs`, over the raw logits and after the chain: loaded on a first use, these kernels
    # would stall every stream of that step (~70 ms)
    if chains:
        smpl = Sampler(msgspec.structs.replace(chains[0], seed=1), n_vocab)
        smpl.sample_with_probs(logits, 2)
        smpl.sample_with_probs(logits, 2, post_sampling=True)


def _jobs(engine: Engine, sampling: tuple[SamplingParams, ...]) -> list[CompileJob]:
    """The compile jobs, longest first: the passes' kernels by code size with the sampler chains among them
    (one job: their kernels' results steer the chain, so they cannot be planned), and last
    each pass whose plan stopped early (it then finds most of its kernels cached)."""
    # no prompt cache in the scratch engine and the jobs' engines (the passes' kernels do not depend on it,
    # and it would announce itself again)
    n_ctx = max(_JOB_CTX, 16 * engine.config.n_parallel)
    cfg = dataclasses.replace(engine.config, n_ctx=n_ctx, warmup=False, cache_ram_mib=0)
    scratch = _scratch_engine(engine.gguf.path, cfg)  # the plan's garbage stays in its tables
    kernels: list[CompileJob] = []
    rest: list[CompileJob] = []
    for name, n_tokens in (("prompt pass", _PROMPT_TOKENS), ("decode pass", 1)):
        planned, finished = plan_compiles(lambda n=n_tokens: _forward(scratch, n))  # type: ignore[misc]
        kernels += [job for job in planned if job not in kernels]
        if not finished:  # the rest of the pass, whatever it needs
            rest.append(CompileJob(name, f"{__name__}:_forward_job", (engine.gguf.path, cfg, n_tokens)))
    chains = CompileJob("sampling", f"{__name__}:warm_sampling", (engine.model.config.n_vocab, sampling))
    # longest first, by code size (the sampler chains compile about as long as 6000 bytes of kernels)
    kernels.sort(key=code_size, reverse=True)
    big = [job for job in kernels if code_size(job) >= _CHAINS_SIZE]
    return [*big, chains, *kernels[len(big) :], *rest]


def _scratch_engine(path: str, config: EngineConfig) -> Engine:
    from .engine import Engine

    return Engine(path, config)


def _forward_job(path: str, config: EngineConfig, n_tokens: int) -> None:
    """A child's job: load the model (no warm-up) and run one forward pass of ``n_tokens``."""
    from .engine import Engine

    _forward(Engine(path, config), n_tokens)
