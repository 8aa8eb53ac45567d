"""Context checkpoints on sliding-window models: resuming from one gives the logits of a full recompute,
bit for bit (a tiny synthetic gemma3 with a window of 4, and Gemma 3 270M with its window of 512).

The scheduler is driven by hand (the test thread plays the engine) so every output row can be kept.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from drive import drive_alone
from tiny_models import write_tiny_model

from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from llama_engine.checkpoints import CheckpointConfig
from llama_engine.step import Step

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
BUDGET = 16
PROMPT = [256, *range(40, 110)]  # 71 tokens: far more than the window pool (3 * 4 + 16 cells) holds


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-ckpt") / "gemma3.gguf", "gemma3", seed=3)


def _engine(path: Path, n_batch: int = BUDGET, **kw) -> Engine:
    # not started: the test calls the scheduler and the model itself
    return Engine(path, EngineConfig(n_ctx=256, n_parallel=2, n_batch=n_batch, warmup=False, **kw))


def _drive(
    engine: Engine, prompt: list[int], n: int, slot: int = 0, cache: bool = True
) -> tuple[list[int], np.ndarray, int]:
    """Run one greedy request alone: its tokens, every logits row it got, and the cached prompt tokens."""
    rows: list[np.ndarray] = []

    def keep(step: Step, logits: np.ndarray) -> None:
        o, k = step.out_offset[slot], step.n_out[slot]
        rows.extend(logits[o : o + k].copy())

    req = GenerationRequest(prompt=prompt, max_tokens=n, sampling=GREEDY, cache_prompt=cache, slot=slot)
    tokens, cached = drive_alone(engine, req, keep)
    return tokens, np.stack(rows), cached


def test_resume_from_a_checkpoint_equals_a_full_recompute(gemma_path: Path) -> None:
    engine = _engine(gemma_path)
    first, _, _ = _drive(engine, PROMPT, 40)  # generating moves the window far past the prompt
    # the prompt ran in chunks ending BUDGET and 4 tokens before its end, each preceded by a checkpoint
    marks = [c.n_tokens for c in engine.scheduler.checkpoints.of(0)]
    assert marks == [len(PROMPT) - BUDGET, len(PROMPT) - 4]
    # the next prompt leaves the cached one between the two: the window pool lost that position
    second = [*PROMPT[:62], 200, 201, 202, 203, 204, 205]
    assert engine.kv.reusable_prefix(0, 62) == 0
    tokens, rows, cached = _drive(engine, second, 6)
    assert cached == len(PROMPT) - BUDGET  # resumed from the older checkpoint, not from the start
    # the checkpoint past the divergence is dropped, the used one kept, new ones taken for this prompt
    assert engine.scheduler.checkpoints.of(0)[0].n_tokens == len(PROMPT) - BUDGET
    ref_tokens, ref_rows, ref_cached = _drive(_engine(gemma_path), second, 6, cache=False)
    assert ref_cached == 0
    assert tokens == ref_tokens
    assert rows.shape == ref_rows.shape and np.array_equal(rows, ref_rows)  # bit for bit
    assert first  # the first turn generated


def test_without_checkpoints_the_prompt_is_recomputed(gemma_path: Path) -> None:
    engine = _engine(gemma_path, checkpoints=CheckpointConfig(n_max=0))
    _drive(engine, PROMPT, 40)
    assert engine.scheduler.checkpoints.of(0) == []
    _, _, cached = _drive(engine, [*PROMPT[:62], 200, 201, 202], 4)
    assert cached == 0


def test_swa_full_needs_no_checkpoints(gemma_path: Path) -> None:
    engine = _engine(gemma_path, swa_full=True)
    assert not engine.scheduler.checkpoints.enabled
    _drive(engine, PROMPT, 40)
    _, _, cached = _drive(engine, [*PROMPT[:62], 200, 201, 202], 4)
    assert cached == 62  # the full-size window pool kept everything


def test_checkpoints_are_bounded_and_logged(gemma_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = _engine(gemma_path, checkpoints=CheckpointConfig(n_max=3, min_step=0))
    ckpts = engine.scheduler.checkpoints
    with caplog.at_level(logging.INFO, logger="llama_engine"):
        prompt = PROMPT
        for turn in range(3):  # each turn extends the last one: its checkpoints pile up
            out, _, _ = _drive(engine, prompt, 3)
            prompt = [*prompt, *out, 150 + turn, 151 + turn]
    assert len(ckpts.of(0)) == 3
    marks = [c.n_tokens for c in ckpts.of(0)]
    assert marks == sorted(marks)
    window = engine.kv.pools[1].window
    for c in ckpts.of(0):  # each holds what the window needs: the window - 1 positions before it
        assert c.parts[0] is None
        pos, k, v = c.parts[1]
        assert pos.tolist() == list(range(c.n_tokens - window + 1, c.n_tokens))
        assert k.shape[1] == v.shape[1] == window - 1
        assert (c.pos_min, c.pos_max) == (c.n_tokens - window + 1, c.n_tokens - 1)
    assert "created context checkpoint 1 of 3 (pos_min = " in caplog.text
    assert "erasing old context checkpoint" in caplog.text
    assert "restored context checkpoint" not in caplog.text  # each turn extended the cache: no restore
    ckpts.clear(0)
    assert ckpts.of(0) == [] and ckpts.nbytes == 0


def test_chunks_cut_by_a_busy_step_take_no_checkpoint(gemma_path: Path) -> None:
    engine = _engine(gemma_path)
    ckpts = engine.scheduler.checkpoints
    _drive(engine, PROMPT, 2)
    before = [c.n_tokens for c in ckpts.of(0)]
    n = len(PROMPT)
    assert ckpts.chunk(n - 30, 16, n) == 14 and ckpts.chunk(n - 10, 16, n) == 6  # stops before the end
    ckpts.before_chunk(0, 1.0, n - 10, 2, n, first=False)  # a chunk cut short near the end: none
    assert [c.n_tokens for c in ckpts.of(0)] == before
    ckpts.before_chunk(0, 1.0, n - 10, 2, n, first=True)  # a request's first chunk: one
    assert [c.n_tokens for c in ckpts.of(0)] == [*before, n - 10]


def test_a_borrowed_prefix_brings_its_checkpoints(gemma_path: Path) -> None:
    engine = _engine(gemma_path)
    _drive(engine, PROMPT, 40, slot=0)
    second = [*PROMPT[:62], 200, 201, 202]
    # slot 1 never saw the prompt: it takes slot 0's prefix and resumes from slot 0's checkpoint
    _, rows, cached = _drive(engine, second, 4, slot=1)
    assert cached == len(PROMPT) - BUDGET
    _, ref_rows, _ = _drive(_engine(gemma_path), second, 4, cache=False)
    assert np.array_equal(rows, ref_rows)


def test_gemma3_270m_resume_equals_full_recompute(gemma3_path: Path, gemma3_tokenizer) -> None:
    """Gemma 3 270M (window 512): a 700-token prompt on slot 0, a longer one on slot 1 whose cells make
    the shared window pool drop slot 0's older positions, then slot 0 again with a prompt that leaves
    the first after 690 tokens: it resumes from the checkpoint 64 tokens before the first prompt's end."""
    text = " ".join(f"item {i} is {i * 7 % 13}," for i in range(400))
    tokens = gemma3_tokenizer.encode(text, add_special=True)
    prompt, other = tokens[:700], [tokens[0], *tokens[701:1700]]
    cfg = EngineConfig(n_ctx=2048, n_parallel=2, n_batch=64, warmup=False)
    engine = Engine(gemma3_path, cfg)
    _drive(engine, prompt, 1, slot=0)
    assert [c.n_tokens for c in engine.scheduler.checkpoints.of(0)] == [700 - 64, 700 - 4]
    _drive(engine, other, 1, slot=1)
    second = prompt[:690] + gemma3_tokenizer.encode(" and then", add_special=False)
    assert engine.kv.reusable_prefix(0, 690) == 0  # the window before 690 is gone
    out, rows, cached = _drive(engine, second, 3, slot=0)
    assert cached == 700 - 64
    ref_out, ref_rows, ref_cached = _drive(engine, second, 3, slot=0, cache=False)
    assert ref_cached == 0
    assert out == ref_out and np.array_equal(rows, ref_rows)
