"""qwen3moe (a mixture-of-experts FFN on every layer) against llama.cpp's generic build (`nox -s parity`).

Tiny random-weight models written with gguf-io: 8 experts, 2 chosen per token, the expert tensors 3-D as
llama.cpp's converter writes them ([n_embd, n_ff_exp, n_expert] for gate and up) in F32, F16, Q8_0 and
Q4_0, the router in F32. Tolerance: none. Logits equal to the bit on a prompt and every greedy step,
for several sequences decoded in one batch, and greedy text through the scheduler with three slots and
after a slot's state is saved, erased and restored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from arch_parity import check_batched_sequences, check_three_slots_and_restore
from test_engine_parity import Oracle, _check_greedy
from tiny_models import N_EMBD, N_EXPERT, write_tiny_model

from gguf_io import GGMLQuantizationType as T
from gguf_io import open as open_gguf
from llama_engine import LLM
from llama_engine.batch import Batch
from llama_engine.layers import MoE

pytestmark = pytest.mark.parity

EXPERT_TYPES = ["F32", "F16", "Q8_0", "Q4_0"]
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def _write(d: Path, expert_type: str) -> Path:
    return write_tiny_model(
        d / f"qwen3moe-{expert_type}.gguf", "qwen3moe", seed=3, expert_qtype=T[expert_type]
    )


@pytest.fixture(scope="module", params=EXPERT_TYPES)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    path = _write(tmp_path_factory.mktemp("moe"), request.param)
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        yield llm, Oracle(path, "f32")


@pytest.fixture(scope="module")
def q4_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("moe-q4"), "Q4_0")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_and_logits_equal_llama_cpp(pair: tuple, prompt: str) -> None:
    llm = pair[0]
    assert all(isinstance(layer.ffn, MoE) for layer in llm.engine.model.layers)
    _check_greedy(*pair, prompt)


def test_batched_sequences_logits_equal_llama_cpp(q4_path: Path) -> None:
    check_batched_sequences(q4_path)


def test_tied_router_scores_choose_experts_as_llama_cpp(tmp_path: Path) -> None:
    """Experts 0, 1 and 2 get one router row (doubled, so the three often lead): equal probabilities,
    of which llama.cpp's argsort keeps the lower indices first, so 0 and 1 are chosen, never 2."""
    path = _write(tmp_path, "Q8_0")
    f = open_gguf(path)
    data = np.memmap(path, np.float32, "r+")
    for name, t in f.tensors.items():
        if name.endswith("ffn_gate_inp.weight"):
            rows = data[t.offset // 4 : t.offset // 4 + N_EXPERT * N_EMBD].reshape(N_EXPERT, N_EMBD)
            rows[:3] = 2 * rows[0]
    data.flush()
    del data, f
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        _check_greedy(llm, Oracle(path, "f32"), PROMPTS[0])
        model = llm.engine.model
        kv = model.make_kv_cache(64, type_k="f32", type_v="f32")
        model.forward(Batch.single(llm.tokenize(PROMPTS[0])), kv)
        assert model.workspace(1).moe is not None
        selected = model.workspace(1).moe.selected
        assert (selected == [0, 1]).all(1).any()  # the last layer chose the tied pair for some token


def test_scheduler_with_three_slots_and_slot_restore_equal_llama_cpp(q4_path: Path, tmp_path: Path) -> None:
    check_three_slots_and_restore(q4_path, tmp_path)
