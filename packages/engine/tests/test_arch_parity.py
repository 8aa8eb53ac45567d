"""Tiny random-weight models of the smaller architectures against llama.cpp's generic build (`nox -s
parity`): smollm3 (every fourth layer without RoPE), mistral3 with dense layers and with experts. Greedy
text and logits at every step equal to the bit. mistral3's attention temperature scaling counts from an
original context of 8 tokens, so the prompts' later positions have q scaled by factors above 1."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tiny_models
from test_engine_parity import Oracle, _check_greedy
from tiny_models import N_FF_EXP, write_tiny_model

from gguf_io import GGUFValueType, GGUFWriter
from llama_engine import LLM
from llama_engine.layers import DenseFFN, MoE

pytestmark = pytest.mark.parity

# name -> (architecture, experts, temperature scaling); mistral3's experts are feed_forward_length wide
# (llama.cpp's n_ff)
CASES = {
    "smollm3": ("smollm3", False, False),
    "mistral3": ("mistral3", False, False),
    "mistral3-moe": ("mistral3", True, False),
    "mistral3-temperature": ("mistral3", False, True),
}
TEMP_CTX = 8  # rope.scaling.original_context_length: the factor steps up every 8 positions


def _temperature(w: GGUFWriter, rng: object) -> None:
    w.add_metadata("mistral3.attention.temperature_scale", 0.1, GGUFValueType.FLOAT32)
    w.add_metadata("mistral3.rope.scaling.original_context_length", TEMP_CTX, GGUFValueType.UINT32)


@pytest.fixture(scope="module", params=list(CASES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    arch, moe, temp = CASES[request.param]
    with pytest.MonkeyPatch.context() as mp:
        if moe:
            mp.setattr(tiny_models, "N_FF", N_FF_EXP)
        path = tmp_path_factory.mktemp("arch") / f"{request.param}.gguf"
        write_tiny_model(path, arch, 4, moe=moe, extra=_temperature if temp else None)
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        yield llm, Oracle(path, "f32"), moe


@pytest.mark.parametrize("prompt", ["The capital of France is", "def fibonacci(n):"])
def test_greedy_text_and_logits_equal_llama_cpp(pair: tuple, prompt: str) -> None:
    llm, oracle, moe = pair
    model = llm.engine.model
    assert all(isinstance(layer.ffn, MoE if moe else DenseFFN) for layer in model.layers)
    if getattr(model, "temperature_scale", 0.0):  # positions past TEMP_CTX scale q
        assert model.q_temperature(np.array([0, TEMP_CTX - 1, TEMP_CTX], np.int32), 3).tolist() == [
            1.0,
            1.0,
            pytest.approx(1.0 + 0.1 * np.log(2.0)),
        ]
    if model.arch == "smollm3":  # layers 3 of 0..6 is the NoPE one
        assert [model.rope_dims(il) == 0 for il in range(model.config.n_layer)] == [i == 3 for i in range(7)]
    _check_greedy(llm, oracle, prompt)
