"""Cache reuse by KV shifting (`n_cache_reuse`): runs of cached tokens after the common prefix are moved
into place instead of recomputed. Tiny random models, the scheduler driven by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from drive import drive_alone
from tiny_models import write_tiny_model

from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from llama_engine.cache_reuse import can_reuse_chunks

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
X = list(range(40, 70))  # 30 tokens
Y = list(range(100, 130))  # 30 tokens
Z = [200, 201, 202, 203, 204]


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny-reuse")
    return {a: write_tiny_model(d / f"{a}.gguf", a, seed=4) for a in ("llama", "gemma3")}


def _engine(path: Path) -> Engine:
    return Engine(path, EngineConfig(n_ctx=256, n_parallel=2, n_batch=16, warmup=False))


def _drive(engine: Engine, prompt: list[int], n: int, slot: int = 0, reuse: int = 0) -> tuple[list[int], int]:
    """One greedy request alone: its tokens and the prompt tokens the cache served."""
    req = GenerationRequest(prompt=prompt, max_tokens=n, sampling=GREEDY, slot=slot, n_cache_reuse=reuse)
    return drive_alone(engine, req)


def test_a_dropped_block_is_reused_by_shifting(paths: dict[str, Path]) -> None:
    engine = _engine(paths["llama"])
    assert can_reuse_chunks(engine.kv)
    _drive(engine, [256, *X, *Y], 4)
    # X dropped: the common prefix is only BOS, Y's 30 cells are shifted back by 30 positions
    out, cached = _drive(engine, [256, *Y, *Z], 4, reuse=8)
    assert cached == 1 + len(Y)
    pos = engine.kv.pools[0].pos[engine.kv.pools[0].seq_cells(0)]
    assert pos.tolist() == list(range(len(engine.scheduler.slots[0].tokens)))  # contiguous again
    assert len(out) == 4


def test_reuse_off_short_runs_and_windowed_models_recompute(paths: dict[str, Path]) -> None:
    engine = _engine(paths["llama"])
    _drive(engine, [256, *X, *Y], 2)
    assert _drive(engine, [256, *Y, *Z], 2)[1] == 1  # n_cache_reuse 0: the prefix only
    _drive(engine, [256, *X, *Y], 2)
    assert _drive(engine, [256, *Y, *Z], 2, reuse=31)[1] == 1  # the run (30) is shorter than asked
    gemma = _engine(paths["gemma3"])
    assert not can_reuse_chunks(gemma.kv)  # its window pool forgets positions: nothing to shift
    _drive(gemma, [256, *X, *Y], 2)
    assert _drive(gemma, [256, *Y, *Z], 2, reuse=8)[1] <= 1  # (0 once the window lost position 0)


def test_shifting_leaves_another_slots_shared_cells(paths: dict[str, Path]) -> None:
    engine = _engine(paths["llama"])
    first = [256, *X, *Y]
    ref, _ = _drive(engine, first, 4, slot=1)
    engine.kv.seq_rm(1)
    engine.scheduler.slots[1].tokens = []
    _drive(engine, first, 4, slot=0)
    # slot 1 borrows slot 0's cells (shared, not copied), then slot 0 shifts its copy of Y
    again, cached = _drive(engine, first, 4, slot=1)
    assert cached == len(first) - 1 and again == ref
    _drive(engine, [256, *Y, *Z], 2, slot=0, reuse=8)
    after, cached = _drive(engine, first, 4, slot=1)
    assert cached == len(first) - 1 and after == ref  # slot 1's cells were not moved
    assert np.all(engine.kv.pools[0].pos[engine.kv.pools[0].seq_cells(1)] >= 0)
