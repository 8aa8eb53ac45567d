"""Tiny random-weight models of the smaller architectures against llama.cpp's generic build (`nox -s
parity`): smollm3 (every fourth layer without RoPE), mistral3 with dense layers and with experts. Greedy
text and logits at every step equal to the bit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tiny_models
from test_engine_parity import Oracle, _check_greedy
from tiny_models import N_FF_EXP, write_tiny_model

from llama_engine import LLM
from llama_engine.layers import DenseFFN, MoE

pytestmark = pytest.mark.parity

# name -> (architecture, experts); mistral3's experts are feed_forward_length wide (llama.cpp's n_ff)
CASES = {"smollm3": ("smollm3", False), "mistral3": ("mistral3", False), "mistral3-moe": ("mistral3", True)}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    arch, moe = CASES[request.param]
    with pytest.MonkeyPatch.context() as mp:
        if moe:
            mp.setattr(tiny_models, "N_FF", N_FF_EXP)
        path = write_tiny_model(tmp_path_factory.mktemp("arch") / f"{request.param}.gguf", arch, 4, moe=moe)
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        yield llm, Oracle(path, "f32"), moe


@pytest.mark.parametrize("prompt", ["The capital of France is", "def fibonacci(n):"])
def test_greedy_text_and_logits_equal_llama_cpp(pair: tuple, prompt: str) -> None:
    llm, oracle, moe = pair
    model = llm.engine.model
    assert all(isinstance(layer.ffn, MoE if moe else DenseFFN) for layer in model.layers)
    if model.arch == "smollm3":  # layers 3 of 0..6 is the NoPE one
        assert [model.rope_dims(il) == 0 for il in range(model.config.n_layer)] == [i == 3 for i in range(7)]
    _check_greedy(llm, oracle, prompt)
