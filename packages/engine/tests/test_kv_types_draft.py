"""The draft model's KV cache follows the target's flash attention rules for its own -ctkd/-ctvd types."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tiny_models
from tiny_models import write_tiny_model

from gguf_io import GGMLQuantizationType
from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams, TokenEvent
from llama_engine.speculative import DraftParams, SpecType, SpeculativeConfig

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
PROMPT = [256, *b"the cat sat on the mat. the cat sat on the mat. the cat"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A tiny target and its Q4_0 copy as the draft, with 64-value heads (block types fit)."""
    d = tmp_path_factory.mktemp("draft-kv")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiny_models, "HEAD_DIM", 64)
        target = write_tiny_model(d / "target.gguf", "llama", seed=5)
        draft = write_tiny_model(d / "draft.gguf", "llama", seed=5, qtype=GGMLQuantizationType.Q4_0)
    yield target, draft


def _engine(pair: tuple[Path, Path], fa: str, ctk: str, ctv: str) -> Engine:
    target, draft = pair
    params = DraftParams(model=str(draft), n_max=4, cache_type_k=ctk, cache_type_v=ctv, flash_attn=fa)
    spec = SpeculativeConfig(types=(SpecType.DRAFT_SIMPLE,), draft=params, adaptive=False)
    cfg = EngineConfig(n_ctx=256, n_parallel=1, n_batch=64, warmup=False, speculative=spec)
    return Engine(target, cfg)


def _draft_flash(engine: Engine) -> bool:
    assert engine.speculator is not None and engine.speculator.draft_model is not None
    return bool(engine.speculator.draft_model.kv.flash_attn)


@pytest.mark.parametrize(
    ("fa", "ctk", "ctv", "flash"),
    [
        ("auto", "f16", "q8_0", True),  # a quantized V turns it on, as for the target
        ("auto", "q8_0", "f16", False),  # a quantized K alone: the mul_mat path
        ("on", "f16", "f16", True),
        ("off", "q4_0", "f16", False),
    ],
)
def test_the_draft_resolves_flash_attention_for_its_own_types(pair, fa, ctk, ctv, flash) -> None:
    engine = _engine(pair, fa, ctk, ctv)
    try:
        assert _draft_flash(engine) is flash
        pool = engine.speculator.draft_model.kv.pools[0]  # type: ignore[union-attr]
        assert (pool.type_k.name, pool.type_v.name) == (ctk, ctv)
    finally:
        engine.shutdown()


def test_a_quantized_draft_v_cache_without_flash_attention_is_refused(pair) -> None:
    with pytest.raises(ValueError, match="quantized V cache requires flash_attn to be enabled"):
        _engine(pair, "off", "f16", "q8_0")


def test_drafting_with_a_quantized_draft_cache_keeps_the_greedy_output(pair) -> None:
    """Drafts from a q8_0/q8_0 flash-attention draft cache: the target's greedy tokens are unchanged."""
    out = []
    for spec in (True, False):
        engine = _engine(pair, "auto", "q8_0", "q8_0")
        if not spec:  # the same target without drafting
            engine.shutdown()
            engine = Engine(pair[0], EngineConfig(n_ctx=256, n_parallel=1, n_batch=64, warmup=False))
        engine.start()
        try:
            h = engine.submit(GenerationRequest(prompt=PROMPT, max_tokens=24, sampling=GREEDY))
            out.append([ev.token for ev in h if isinstance(ev, TokenEvent)])
            if spec:
                assert h.final is not None and h.final.timings.draft_n > 0
        finally:
            engine.shutdown()
    assert out[0] == out[1] and len(out[0]) == 24
