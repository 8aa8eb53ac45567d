"""RoPE frequency factors against llama.cpp's generic build: Llama 3.1's per-dimension `rope_freqs.weight`
and Phi-3's longrope (`rope.scaling.type = longrope`, `rope_factors_long/short.weight`, the long pair when
a sequence's context exceeds the original context length). Tiny models written with gguf-io; greedy text
and logits equal to the bit (run by `nox -s parity`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from test_engine_parity import Oracle, _check_greedy
from tiny_models import HEAD_DIM, write_tiny_model

from gguf_io import GGMLQuantizationType, GGUFValueType, GGUFWriter
from llama_engine import LLM
from llama_engine.arch.rope_scaling import freq_factors, rope_scaling

pytestmark = pytest.mark.parity

HALF = HEAD_DIM // 2
Extra = Callable[[GGUFWriter, np.random.Generator], None]


def _factors(w: GGUFWriter, name: str, values: np.ndarray) -> None:
    w.add_tensor(name, [HALF], GGMLQuantizationType.F32, values.astype(np.float32))


def _llama3(w: GGUFWriter, rng: np.random.Generator) -> None:
    # Llama 3.1's shape of factors: 1 for the fast dimensions, growing to 8 for the slow ones
    _factors(w, "rope_freqs.weight", np.geomspace(1.0, 8.0, HALF) * (1 + 0.1 * rng.random(HALF)))


def _longrope(n_ctx_orig: int) -> Extra:
    def extra(w: GGUFWriter, rng: np.random.Generator) -> None:
        # llama.cpp gives a model named like Phi-3 that tokenizer's <unk>: the byte vocabulary has none
        w._fields.pop("general.name")
        w.add_metadata("general.name", "tiny-longrope")
        w.add_metadata("phi3.rope.scaling.type", "longrope")
        w.add_metadata("phi3.rope.scaling.attn_factor", 1.1902380714238083)
        w.add_metadata("phi3.rope.scaling.original_context_length", n_ctx_orig, GGUFValueType.UINT32)
        _factors(w, "rope_factors_long.weight", 1.0 + 30.0 * rng.random(HALF))
        _factors(w, "rope_factors_short.weight", 1.0 + 0.5 * rng.random(HALF))

    return extra


# name -> (architecture, extra metadata and tensors, the factor tensor llama.cpp picks at n_ctx 512)
CASES: dict[str, tuple[str, Extra, str]] = {
    "llama3-rope-freqs": ("llama", _llama3, "rope_freqs.weight"),
    "phi3-longrope-long": ("phi3", _longrope(128), "rope_factors_long.weight"),
    "phi3-longrope-short": ("phi3", _longrope(4096), "rope_factors_short.weight"),
}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    arch, extra, picked = CASES[request.param]
    path = write_tiny_model(tmp_path_factory.mktemp("rope") / f"{request.param}.gguf", arch, 5, extra=extra)
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        yield llm, Oracle(path, "f32"), picked


@pytest.mark.parametrize("prompt", ["The capital of France is", "def fibonacci(n):"])
def test_rope_factor_logits_equal_llama_cpp(pair: tuple, prompt: str) -> None:
    llm, oracle, picked = pair
    model = llm.engine.model
    assert picked in model._rope_factors and model.n_ctx_seq == 512
    _check_greedy(llm, oracle, prompt)


def test_factors_change_the_table(pair: tuple) -> None:
    """The factors are in effect: the table differs from the plain one (so parity is not vacuous)."""
    model = pair[0].engine.model
    with_ff = model.rope_cache(0, 64)
    model._rope.clear()
    factors = model._rope_factors
    model._rope_factors = {}
    try:
        plain = model.rope_cache(0, 64)
    finally:
        model._rope_factors = factors
        model._rope.clear()
    assert not np.array_equal(with_ff[:64], plain[:64])


def test_longrope_choice_and_metadata() -> None:
    one, two, three = (np.full(HALF, v, np.float32) for v in (1.0, 2.0, 3.0))
    tensors = {"rope_factors_long.weight": two, "rope_factors_short.weight": three}
    assert freq_factors(tensors, 4097, 4096) is two and freq_factors(tensors, 4096, 4096) is three
    assert freq_factors({**tensors, "rope_freqs.weight": one}, 8192, 4096) is one  # rope_freqs wins
    assert freq_factors({}, 8192, 4096) is None
    s = rope_scaling(
        {"phi3.rope.scaling.type": "longrope", "phi3.rope.scaling.attn_factor": 1.5}, "phi3", 4096
    )
    assert s.ext_factor == 0.0 and s.freq_scale == 1.0 and s.attn_factor == 1.5 and s.n_ctx_orig == 4096
    with pytest.raises(ValueError, match="dynamic"):
        rope_scaling({"phi3.rope.scaling.type": "dynamic"}, "phi3", 4096)
