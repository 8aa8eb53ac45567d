"""Speculative decoding on models with recurrent layers (tiny lfm2 and qwen35): the state saved before a
verification pass is restored when drafts are rejected and the accepted tokens run again, so greedy output
equals plain decoding, with n-gram drafters and draft models (itself, or one of other weights), two slots
drafting at once.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from tiny_models import write_tiny_model

from gguf_io import GGMLQuantizationType
from gguf_io import open as open_gguf
from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams, TokenEvent
from llama_engine.memory import RecurrentPool
from llama_engine.requests import FinalEvent
from llama_engine.speculative import (
    DraftParams,
    NgramMapParams,
    NgramModParams,
    SpecType,
    SpeculativeConfig,
)
from llama_engine.speculative.draft_model import DraftModel

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
PROMPTS = [
    [256, *b"the cat sat on the mat. the cat sat on the mat. the cat"],
    [256, *b"a dog ran. a dog ran. a dog ran. a dog"],
]
N = 32
MUTED = 0.3  # the share of tokens the draft model never proposes


@pytest.fixture(scope="module", params=["lfm2", "qwen35"])
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp(f"spec-{request.param}")
    target = write_tiny_model(d / "target.gguf", request.param, seed=3)
    return target, _perturbed(target, d / "draft.gguf")


def _perturbed(target: Path, path: Path) -> Path:
    """A copy of `target` whose output projection gives some tokens a logit of 0 (their Q8_0 rows' f16
    scales zeroed; a block is a scale and 32 int8): a draft model that agrees with the target except where
    the target's token is one of those."""
    shutil.copyfile(target, path)
    f = open_gguf(target)
    t = f.tensors["output.weight"]
    assert t.ggml_type == GGMLQuantizationType.Q8_0
    start, n_rows = f.data_offset + t.offset, t.shape[1]
    f.close()
    with open(path, "r+b") as out:
        out.seek(start)
        blocks = np.frombuffer(out.read(t.nbytes), np.uint8).reshape(n_rows, -1, 34).copy()
        blocks[np.random.default_rng(0).random(n_rows) < MUTED, :, :2] = 0
        out.seek(start)
        out.write(blocks.tobytes())
    return path


def _generate(
    target: Path, spec: SpeculativeConfig | None
) -> tuple[list[list[int]], list[FinalEvent], Engine]:
    """Both prompts at once on a fresh engine of two slots: each one's tokens and final event."""
    config = EngineConfig(n_ctx=512, n_parallel=2, n_batch=64, warmup=False, speculative=spec)
    engine = Engine(target, config).start()
    try:
        handles = [engine.submit(GenerationRequest(prompt=p, max_tokens=N, sampling=GREEDY)) for p in PROMPTS]
        toks = [[ev.token for ev in h if isinstance(ev, TokenEvent)] for h in handles]
        finals = [h.final for h in handles]
        assert all(f is not None for f in finals)
        return toks, finals, engine  # type: ignore[return-value]
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def plain(models: tuple[Path, Path]) -> list[list[int]]:
    return _generate(models[0], None)[0]


def _draft(model: Path) -> SpeculativeConfig:
    # a fixed draft length: drafts are verified at every step (the adaptive limit would pause them)
    return SpeculativeConfig(
        types=(SpecType.DRAFT_SIMPLE,), draft=DraftParams(model=str(model), n_max=4), adaptive=False
    )


SPECS = {
    "ngram-simple": lambda m: SpeculativeConfig(
        types=(SpecType.NGRAM_SIMPLE,), ngram_simple=NgramMapParams(1, 4, 1), adaptive=False
    ),
    "ngram-mod": lambda m: SpeculativeConfig(
        types=(SpecType.NGRAM_MOD,), ngram_mod=NgramModParams(1, 1, 8), adaptive=False
    ),
    "draft-perturbed": lambda m: _draft(m[1]),
}


@pytest.mark.parametrize("kind", list(SPECS))
def test_rejected_drafts_roll_the_state_back(models, plain, kind: str) -> None:
    toks, finals, engine = _generate(models[0], SPECS[kind](models))
    assert toks == plain  # two slots drafting in one batch, each as plain decoding alone
    stats = engine.speculator.stats  # type: ignore[union-attr]
    assert stats.n_accepted < stats.n_draft_tokens  # drafts were rejected: the state rolled back
    if kind.startswith("draft"):  # the random model rarely repeats itself: only a draft model agrees
        assert stats.n_accepted > 0
    assert sum(f.timings.draft_n for f in finals) == stats.n_draft_tokens
    assert sum(f.timings.draft_n_accepted for f in finals) == stats.n_accepted


def test_the_model_as_its_own_draft_is_accepted(models, plain) -> None:
    toks, finals, _ = _generate(models[0], _draft(models[0]))
    assert toks == plain
    for f in finals:  # the draft's greedy choice is the target's (a stop below p-min aside)
        assert f.timings.draft_n > 0 and f.timings.draft_n_accepted == f.timings.draft_n


def test_a_snapshot_restores_the_state_it_saved() -> None:
    pool = RecurrentPool(2, [0, 1], 3, 2)
    pool.k[1][1], pool.v[0][1], pool.pos[1] = 1.5, 2.5, 7
    pool.snapshot(1)
    pool.k[1][1], pool.v[0][1], pool.pos[1] = 9.0, 9.0, 9
    pool.k[0][0] = 4.0  # another sequence's state is not the snapshot's
    assert pool.restore(1) == 7
    assert np.all(pool.k[1][1] == 1.5) and np.all(pool.v[0][1] == 2.5) and pool.pos[1] == 7
    assert np.all(pool.k[0][0] == 4.0)


def test_the_draft_models_state_goes_back_as_if_recomputed(models, monkeypatch) -> None:
    """A recurrent draft model restores its saved state: the drafts are those of a draft model that
    recomputes each sequence from its first token."""
    spec = SPECS["draft-perturbed"](models)
    toks, _, engine = _generate(models[0], spec)
    monkeypatch.setattr(DraftModel, "_rewind", lambda self, seq, p: (self.forget(seq), 0)[1])
    toks2, _, again = _generate(models[0], spec)
    assert toks == toks2 and engine.speculator.stats == again.speculator.stats  # type: ignore[union-attr]
