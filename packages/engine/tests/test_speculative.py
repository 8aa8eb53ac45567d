"""Speculative decoding on tiny real models: drafts are verified in the target's batched pass.

Greedy output equals plain decoding for every drafter and n-min/n-max pair; rejection sampling keeps the
target's distribution (a chi-square test); synthetic acceptance keeps or drops every draft; a draft model
of another vocabulary is refused; token limits, grammars and context shifts hold with drafting.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import tiny_models
from tiny_models import write_tiny_model

from gguf_io import GGMLQuantizationType
from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams, TokenEvent
from llama_engine.requests import FinalEvent, StopReason
from llama_engine.sampling import Sampler
from llama_engine.speculative import (
    DraftParams,
    NgramMapParams,
    NgramModParams,
    SpecType,
    SpeculativeConfig,
)
from llama_engine.speculative.verify import RejectionVerifier

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
PROMPT = [256, *b"the cat sat on the mat. the cat sat on the mat. the cat"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("spec")
    target = write_tiny_model(d / "target.gguf", "llama", seed=3)
    # the same weights at lower precision: a draft that agrees often, not always
    draft = write_tiny_model(d / "draft.gguf", "llama", seed=3, qtype=GGMLQuantizationType.Q4_0)
    return target, draft


def _generate(
    target: Path,
    spec: SpeculativeConfig | None,
    reqs: list[GenerationRequest],
    **cfg: object,
) -> list[tuple[list[int], FinalEvent]]:
    """Run the requests concurrently on a fresh engine; (tokens, final event) of each."""
    base: dict[str, object] = {"n_ctx": 512, "n_parallel": 2, "n_batch": 64, "warmup": False}
    config = EngineConfig(**{**base, **cfg}, speculative=spec)  # type: ignore[arg-type]
    engine = Engine(target, config).start()
    try:
        handles = [engine.submit(r) for r in reqs]
        out = []
        for h in handles:
            toks = [ev.token for ev in h if isinstance(ev, TokenEvent)]
            assert h.final is not None
            out.append((toks, h.final))
        return out
    finally:
        engine.shutdown()


def _draft(model: Path, **kw: object) -> SpeculativeConfig:
    return SpeculativeConfig(types=(SpecType.DRAFT_SIMPLE,), draft=DraftParams(model=str(model), **kw))  # type: ignore[arg-type]


def _req(prompt: list[int] = PROMPT, n: int = 40, **kw: object) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, max_tokens=n, sampling=kw.pop("sampling", GREEDY), **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plain(models: tuple[Path, Path]) -> list[int]:
    return _generate(models[0], None, [_req()])[0][0]


@pytest.mark.parametrize(("n_min", "n_max"), [(0, 2), (1, 4), (4, 8), (2, 16)])
def test_draft_model_greedy_equals_plain_decoding(models, plain, n_min: int, n_max: int) -> None:
    target, draft = models
    # this draft agrees rarely: the fixed draft length keeps verifying drafts at every step (the
    # adaptive limit would soon pause them, test_speculative_backoff.py)
    spec = dataclasses.replace(_draft(draft, n_min=n_min, n_max=n_max), adaptive=False)
    (a, fa), (b, fb) = _generate(target, spec, [_req(), _req()])
    assert a == b == plain  # two slots drafting in one batch, each as alone without drafts
    for f in (fa, fb):
        assert f.timings.draft_n > 0 and 0 < f.timings.draft_n_accepted <= f.timings.draft_n
        assert f.timings.predicted_n == 40 and f.reason == StopReason.LENGTH


@pytest.mark.parametrize(
    "spec",
    [
        SpeculativeConfig(types=(SpecType.NGRAM_SIMPLE,), ngram_simple=NgramMapParams(1, 4, 1)),
        SpeculativeConfig(types=(SpecType.NGRAM_MAP_K,), ngram_map_k=NgramMapParams(1, 4, 1)),
        SpeculativeConfig(types=(SpecType.NGRAM_MAP_K4V,), ngram_map_k4v=NgramMapParams(1, 4, 1)),
        SpeculativeConfig(types=(SpecType.NGRAM_MOD,), ngram_mod=NgramModParams(1, 1, 8)),
        SpeculativeConfig(types=(SpecType.NGRAM_CACHE,)),
        SpeculativeConfig(
            types=(SpecType.NGRAM_SIMPLE, SpecType.NGRAM_CACHE), ngram_simple=NgramMapParams(1, 4, 1)
        ),
    ],
    ids=["simple", "map-k", "map-k4v", "mod", "cache", "simple+cache"],
)
def test_ngram_drafters_greedy_equals_plain_decoding(models, plain, spec: SpeculativeConfig) -> None:
    ((toks, final),) = _generate(models[0], spec, [_req()])
    assert toks == plain
    assert final.timings.draft_n > 0  # the repetitive prompt gives every drafter something to propose


def test_synthetic_rate_zero_rejects_everything(models, plain) -> None:
    spec = _draft(models[1], n_max=4)
    spec = SpeculativeConfig(types=spec.types, draft=spec.draft, synth_rates=(0.0,) * 4)
    sampled = SamplingParams(temperature=0.8, top_k=5, seed=4242, ignore_eos=True)
    ((toks, f),) = _generate(models[0], spec, [_req(sampling=sampled)])
    ((ref, _),) = _generate(models[0], None, [_req(sampling=sampled)])
    assert toks == ref  # every draft rejected: the target's own (seeded) sampling
    assert f.timings.draft_n > 0 and f.timings.draft_n_accepted == 0


def test_synthetic_rate_one_accepts_everything_and_keeps_the_limit(models) -> None:
    spec = _draft(models[1], n_max=4)
    spec = SpeculativeConfig(types=spec.types, draft=spec.draft, synth_rates=(1.0,) * 4)
    ((toks, f),) = _generate(models[0], spec, [_req(n=37)])
    assert len(toks) == 37 and f.reason == StopReason.LENGTH
    assert f.timings.draft_n > 0 and f.timings.draft_n_accepted == f.timings.draft_n


def test_grammar_request_keeps_its_grammar_and_length(models) -> None:
    grammar = SamplingParams(temperature=0.0, grammar="root ::= [a-z ]+", ignore_eos=True)
    ref = _generate(models[0], None, [_req(n=24, sampling=grammar)])[0]
    ((toks, f),) = _generate(models[0], _draft(models[1], n_max=4), [_req(n=24, sampling=grammar)])
    assert toks == ref[0] and len(toks) == 24 and f.reason == StopReason.LENGTH
    assert all(t == 32 or 97 <= t <= 122 for t in toks)


def test_context_shift_with_drafting(models) -> None:
    long = [256, *range(40, 90)]
    kw = dict(context_shift=True, n_keep=4)
    ref = _generate(models[0], None, [_req(long, 60, **kw)], n_ctx=80)[0]
    ((toks, f),) = _generate(models[0], _draft(models[1], n_max=6), [_req(long, 60, **kw)], n_ctx=80)
    assert len(toks) == 60 and toks == ref[0] and f.timings.draft_n > 0


def test_probabilistic_drafting_runs_rejection_sampling(models) -> None:
    spec = _draft(models[1], n_max=4, probabilistic=True)
    sampled = SamplingParams(temperature=1.0, seed=7, ignore_eos=True)
    ((a, fa),) = _generate(models[0], spec, [_req(sampling=sampled)])
    ((b, _),) = _generate(models[0], spec, [_req(sampling=sampled)])
    assert a == b and len(a) == 40  # seeded: reproducible
    assert fa.timings.draft_n > 0


def test_rejection_sampling_keeps_the_target_distribution() -> None:
    """Draft x ~ q, then verify: the chosen token must follow p (chi-square over 20000 draws)."""
    n_vocab, n = 8, 20000
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1.5, n_vocab).astype(np.float32)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    q = np.exp(rng.normal(0, 1.5, n_vocab))
    q /= q.sum()
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11), n_vocab)
    verifier = RejectionVerifier(12)
    q_dist = (np.arange(n_vocab, dtype=np.int32), q.astype(np.float32))
    counts = np.zeros(n_vocab)
    for x in rng.choice(n_vocab, n, p=q).tolist():
        token, _ = verifier.choose(sampler, logits, x, q_dist)
        counts[token] += 1
    expected = n * p
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 24.3  # the 99.9% point of chi-square with 7 degrees of freedom
    counts_q = np.bincount(rng.choice(n_vocab, n, p=q), minlength=n_vocab)
    assert float(((counts_q - expected) ** 2 / expected).sum()) > 24.3  # the test tells q from p


def test_draft_model_of_another_vocabulary_is_refused(models, tmp_path: Path, monkeypatch) -> None:
    tokens = tiny_models._byte_tokens()
    monkeypatch.setattr(tiny_models, "_byte_tokens", lambda: tokens[::-1])
    other = write_tiny_model(tmp_path / "other.gguf", "llama", seed=3)
    with pytest.raises(ValueError, match="draft model cannot be used for speculative decoding: token 5"):
        Engine(models[0], EngineConfig(n_ctx=128, warmup=False, speculative=_draft(other)))


def test_config_validation_messages() -> None:
    with pytest.raises(ValueError, match="rates must contain 8 values, got 2"):
        SpeculativeConfig(types=(SpecType.NGRAM_CACHE,), synth_rates=(1.0, 0.5)).validate()
    with pytest.raises(ValueError, match="monotonically non-increasing"):
        SpeculativeConfig(
            types=(SpecType.DRAFT_SIMPLE,), draft=DraftParams("x"), synth_rates=(0.1, 0.5, 0.4)
        ).validate()
    with pytest.raises(ValueError, match="mutually exclusive"):
        SpeculativeConfig(types=(SpecType.NGRAM_CACHE,), synth_len=2.0, synth_rates=(1.0,) * 8).validate()
    with pytest.raises(ValueError, match="requires a draft model"):
        SpeculativeConfig(types=(SpecType.DRAFT_SIMPLE,)).validate()
    rates = SpeculativeConfig(types=(SpecType.NGRAM_CACHE,), synth_len=3.0).synth_rates_resolved()
    assert len(rates) == 8 and abs(sum(rates) - 2.0) < 1e-6  # mean acceptance length 1 + sum = 3
