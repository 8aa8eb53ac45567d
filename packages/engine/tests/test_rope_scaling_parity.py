"""RoPE scaling (linear, YaRN) against llama.cpp's generic build: the same settings on both sides, given to
llama.cpp as context parameters (`rope_scaling_type`, `rope_freq_scale`, `yarn_*`) and to the engine as
the model metadata llama-server's flags become (`<arch>.rope.scaling.*`); greedy text and logits equal
to the bit (run by `nox -s parity`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_engine_parity import Oracle, _check_greedy

from gguf_io import open as open_gguf
from llama_engine import LLM
from llama_engine.arch.rope_scaling import rope_scaling

pytestmark = pytest.mark.parity

# name -> (llama.cpp context fields, the metadata keys after "<arch>.rope.")
SETTINGS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "linear": (
        {"rope_scaling_type": 1, "rope_freq_scale": 0.5},
        {"scaling.type": "linear", "scaling.factor": 2.0},
    ),
    "yarn": (
        {"rope_scaling_type": 2, "rope_freq_scale": 0.25, "yarn_orig_ctx": 2048},
        {"scaling.type": "yarn", "scaling.factor": 4.0, "scaling.original_context_length": 2048},
    ),
    "yarn-tuned": (
        {
            "rope_scaling_type": 2,
            "rope_freq_scale": 0.5,
            "yarn_orig_ctx": 1024,
            "yarn_ext_factor": 0.5,
            "yarn_beta_fast": 16.0,
            "yarn_beta_slow": 2.0,
        },
        {
            "scaling.type": "yarn",
            "scaling.factor": 2.0,
            "scaling.original_context_length": 1024,
            "scaling.yarn_ext_factor": 0.5,
            "scaling.yarn_beta_fast": 16.0,
            "scaling.yarn_beta_slow": 2.0,
        },
    ),
}


def _oracle(path: Any, fields: dict[str, Any]) -> Oracle:
    import llama_cpp

    default = llama_cpp.llama_context_default_params

    def with_rope() -> Any:
        cp = default()
        for k, v in fields.items():
            setattr(cp, k, v)
        return cp

    llama_cpp.llama_context_default_params = with_rope
    try:
        return Oracle(path, "f32")
    finally:
        llama_cpp.llama_context_default_params = default


def _scaled(path: Any, keys: dict[str, Any]) -> Any:
    gguf = open_gguf(path)
    arch = gguf.header.architecture
    gguf.__dict__["metadata"] = {**gguf.metadata, **{f"{arch}.rope.{k}": v for k, v in keys.items()}}
    return gguf


@pytest.fixture(scope="module", params=[("smollm2_path", s) for s in SETTINGS] + [("gemma3_path", "yarn")])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[LLM, Oracle]]:
    name, setting = request.param
    path = request.getfixturevalue(name)
    fields, keys = SETTINGS[setting]
    with LLM(_scaled(path, keys), n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        yield llm, _oracle(path, fields)


@pytest.mark.parametrize("prompt", ["The capital of France is", "def fibonacci(n):"])
def test_scaled_rope_logits_equal_llama_cpp(pair: tuple[LLM, Oracle], prompt: str) -> None:
    assert pair[0].engine.model.rope_scaling.freq_scale < 1.0  # the scaling is in effect on our side
    _check_greedy(*pair, prompt)


def test_scaling_from_metadata() -> None:
    none = rope_scaling({"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 4.0}, "llama", 8192)
    assert none.freq_scale == 1.0 and none.ext_factor == 0.0 and none.attn_factor == 1.0
    yarn = rope_scaling({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, "llama", 8192)
    assert yarn.freq_scale == 0.25 and yarn.ext_factor == 1.0 and yarn.n_ctx_orig == 8192
    # llama.cpp: get_mscale(4) / (1 + 0.1 ln 4) == 1 (ggml multiplies the second factor back in)
    assert yarn.attn_factor == pytest.approx(1.0, abs=1e-6)
    linear = rope_scaling({"llama.rope.scale_linear": 2.0}, "llama", 2048)
    assert linear.freq_scale == 0.5 and linear.ext_factor == 0.0
    with pytest.raises(ValueError, match="dynamic"):
        rope_scaling({"llama.rope.scaling.type": "dynamic"}, "llama", 2048)
