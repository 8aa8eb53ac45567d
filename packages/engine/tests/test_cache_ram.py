"""The host-RAM prompt cache (`cache_ram_mib`, llama-server's --cache-ram / --cache-idle-slots): a
slot's cache saved before another prompt takes its cells comes back for a later prompt that matches it.
Tiny random models, the scheduler driven by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from drive import drive_alone
from tiny_models import write_tiny_model

from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
A = [256, *range(40, 80)]
B = [256, *range(120, 160)]


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-ram") / "llama.gguf", "llama", seed=6)


def _engine(path: Path, n_parallel: int = 1, **kw) -> Engine:
    cfg = EngineConfig(n_ctx=256, n_parallel=n_parallel, n_batch=32, warmup=False, **kw)
    return Engine(path, cfg)


def _drive(engine: Engine, prompt: list[int], n: int = 3, slot: int = -1) -> tuple[list[int], int]:
    return drive_alone(engine, GenerationRequest(prompt=prompt, max_tokens=n, sampling=GREEDY, slot=slot))


def test_an_evicted_prompt_comes_back_from_ram(path: Path) -> None:
    plain = _engine(path)
    ref_a, _ = _drive(plain, A)
    _drive(plain, B)
    assert _drive(plain, A)[1] == 1  # without the RAM cache: only BOS is shared
    engine = _engine(path, cache_ram_mib=64)
    cache = engine.scheduler.prompt_cache
    assert cache is not None
    _drive(engine, A)
    _drive(engine, B)  # B takes the only slot: A's cache is saved first
    assert [len(s.tokens) for s in cache.states] == [len(A) + 2]
    out, cached = _drive(engine, A)  # A is loaded back (and B saved)
    assert cached == len(A) - 1 and out == ref_a
    assert [s.tokens[:2] for s in cache.states] == [B[:2]]


def test_the_limit_drops_the_oldest_and_skips_what_cannot_fit(path: Path) -> None:
    engine = _engine(path, cache_ram_mib=64)
    cache = engine.scheduler.prompt_cache
    assert cache is not None
    _drive(engine, A)
    _drive(engine, B)
    size = cache.states[0].nbytes
    cache.limit = int(size * 1.5)  # room for one state of this size
    _drive(engine, [256, *range(160, 200)])  # saves B: A goes
    assert [s.tokens[1] for s in cache.states] == [120]
    cache.limit = size // 2  # nothing fits
    assert not cache.save(0, engine.scheduler.slots[0].tokens, (), [])
    assert [s.tokens[1] for s in cache.states] == [120]


def test_idle_slots_are_saved_and_cleared_when_a_request_starts(path: Path) -> None:
    engine = _engine(path, n_parallel=2, cache_ram_mib=64, cache_idle_slots=True)
    cache = engine.scheduler.prompt_cache
    assert cache is not None and cache.clear_idle  # a unified KV cache
    ref, _ = _drive(engine, A, slot=0)
    _drive(engine, B, slot=1)  # slot 0 is idle: saved, then cleared
    assert engine.scheduler.slots[0].tokens == [] and engine.kv.pools[0].seq_cells(0).size == 0
    assert len(cache.states) == 1 and cache.states[0].tokens[: len(A)] == A
    out, cached = _drive(engine, A, slot=0)
    assert cached == len(A) - 1 and out == ref


def test_without_a_size_limit_a_context_of_tokens_is_kept(path: Path) -> None:
    engine = _engine(path, cache_ram_mib=-1)
    cache = engine.scheduler.prompt_cache
    assert cache is not None and cache.limit == 0
    for i in range(8):  # 8 prompts of 41 tokens through one slot: each evicts the one before
        _drive(engine, [256, *range(i * 20, i * 20 + 40)], 2)
    assert 0 < cache.n_tokens <= engine.kv.n_ctx < cache.n_tokens + 42
    assert cache.states[-1].tokens[1] == 6 * 20  # the newest saved is the one before the last
