"""The adaptive draft limit: rejected drafts shrink and then pause a slot's drafting, accepted ones restore it.

Counted in draft-model forward passes and drafted tokens on tiny real models, never in time: with every
draft rejected (synthetic rate 0) the back-off leaves a small fraction of llama.cpp's fixed `n_max` work,
with every draft accepted it never engages, with a draft that is the target itself it barely does, and greedy output is the
plain decoding's either way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import write_tiny_model

from gguf_io import GGMLQuantizationType
from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams, TokenEvent
from llama_engine.speculative import DraftParams, SpecType, SpeculativeConfig
from llama_engine.speculative.backoff import WAIT_MAX, Backoff

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
PROMPT = [256, *b"the cat sat on the mat. the cat sat on the mat. the cat"]
N = 60
N_MAX = 8


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("backoff")
    target = write_tiny_model(d / "target.gguf", "llama", seed=3)
    draft = write_tiny_model(d / "draft.gguf", "llama", seed=3, qtype=GGMLQuantizationType.Q4_0)
    return target, draft


def _run(target: Path, spec: SpeculativeConfig | None) -> tuple[list[int], int, int, int]:
    """(tokens, drafted, accepted, draft-model forwards) of one greedy request of N tokens."""
    cfg = EngineConfig(n_ctx=256, n_parallel=1, n_batch=64, warmup=False, speculative=spec)
    engine = Engine(target, cfg).start()
    forwards = [0]
    try:
        dm = engine.speculator.draft_model if engine.speculator is not None else None
        if dm is not None:
            forward = dm.model.forward

            def counted(*args: object, **kw: object) -> object:
                forwards[0] += 1
                return forward(*args, **kw)  # type: ignore[arg-type]

            dm.model.forward = counted  # type: ignore[method-assign]
        h = engine.submit(GenerationRequest(prompt=PROMPT, max_tokens=N, sampling=GREEDY))
        toks = [ev.token for ev in h if isinstance(ev, TokenEvent)]
        assert h.final is not None
        return toks, h.final.timings.draft_n, h.final.timings.draft_n_accepted, forwards[0]
    finally:
        engine.shutdown()


def _spec(draft: Path, adaptive: bool = True, **kw: object) -> SpeculativeConfig:
    return SpeculativeConfig(
        types=(SpecType.DRAFT_SIMPLE,),
        draft=DraftParams(model=str(draft), n_max=N_MAX),
        adaptive=adaptive,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def plain(models: tuple[Path, Path]) -> list[int]:
    return _run(models[0], None)[0]


def test_rate_zero_backs_off(models, plain) -> None:
    rate0 = {"synth_rates": (0.0,) * N_MAX}
    toks, drafted, accepted, forwards = _run(models[0], _spec(models[1], **rate0))
    fixed, drafted_fixed, _, forwards_fixed = _run(models[0], _spec(models[1], adaptive=False, **rate0))
    assert toks == fixed == plain and accepted == 0
    assert drafted_fixed >= N_MAX * (N - 10)  # llama.cpp's policy: a full draft at every step
    assert forwards_fixed >= N_MAX * (N - 10)
    # 8 + 4 + 2 + 1 drafted tokens, then single-token probes after 1, 2, 4, 8, 16, 32 skipped steps
    assert drafted <= 15 + 6
    assert forwards <= drafted + 1 and forwards * 10 < forwards_fixed


def test_accepted_drafts_keep_full_length(models) -> None:
    rate1 = {"synth_rates": (1.0,) * N_MAX}  # every draft accepted
    toks, drafted, accepted, forwards = _run(models[0], _spec(models[1], **rate1))
    fixed, drafted_fixed, _, forwards_fixed = _run(models[0], _spec(models[1], adaptive=False, **rate1))
    assert toks == fixed and len(toks) == N
    # never shortened: the same drafts and draft forwards as without the policy
    assert accepted == drafted == drafted_fixed > 0 and forwards == forwards_fixed


def test_self_draft_mostly_full_length(models, plain) -> None:
    toks, drafted, accepted, _ = _run(models[0], _spec(models[0]))  # the target drafting for itself
    fixed, drafted_fixed, _, _ = _run(models[0], _spec(models[0], adaptive=False))
    assert toks == fixed == plain
    assert accepted > 0.8 * drafted and drafted > 0.8 * drafted_fixed


def test_partial_acceptance_keeps_output_and_drafts(models, plain) -> None:
    toks, drafted, accepted, forwards = _run(models[0], _spec(models[1]))
    assert toks == plain
    assert 0 < accepted <= drafted and forwards > 0


def test_backoff_engages_on_rejection() -> None:
    b = Backoff(full=8)
    limits = []
    for _ in range(4):  # every draft rejected at once: 8, 4, 2, 1
        limits.append(b.allow())
        b.update(limits[-1], 0)
    assert limits == [8, 4, 2, 1]
    skipped = []
    for _ in range(8):  # at the floor: pauses of 1, 2, 4, ... steps, capped
        n = 0
        while b.allow() == 0:
            n += 1
        skipped.append(n)
        b.update(1, 0)
    assert skipped == [1, 2, 4, 8, 16, 32, 32, 32] and WAIT_MAX == 32
    assert b.n_skipped == sum(skipped)


def test_backoff_releases_on_acceptance() -> None:
    b = Backoff(full=8)
    for _ in range(6):
        while b.allow() == 0:
            pass
        b.update(b.limit, 0)
    assert b.limit == 1 and b.wait > 1
    while b.allow() == 0:
        pass
    b.update(1, 1)  # the probe was accepted: no more pauses, the limit doubles back to full
    assert b.wait == 1 and b.skip == 0
    seen = []
    for _ in range(3):
        seen.append(b.allow())
        b.update(seen[-1], seen[-1])
    assert seen == [2, 4, 8] and b.allow() == 8
    b.update(8, 5)  # rejected at position 5: one more than the drafter got right
    assert b.allow() == 6 and b.wait == 1


def test_backoff_floor_is_the_draft_n_min() -> None:
    b = Backoff(full=8, floor=4)
    for _ in range(2):  # 8, then 4: at the floor, so the pause starts
        b.update(b.allow(), 0)
    assert b.limit == 4 and b.skip > 0  # never below n_min (shorter drafts would propose nothing)
    assert Backoff(full=2, floor=5).floor == 2
