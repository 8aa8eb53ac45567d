"""qwen35 / qwen35moe (gated delta-net layers mixed with gated attention layers) against llama.cpp's
generic build (`nox -s parity`).

Tiny random-weight models written with gguf-io (tiny_qwen35): four layers, attention at 1 and 3, the
others gated delta-nets whose conv and delta states live in the memory's recurrent pool; partial M-RoPE
with a section at the fourth position. qwen35moe: every FFN a routed mixture of experts plus the gated
shared expert. Tolerance: none. Logits equal to the bit on a prompt and every greedy step, for several
sequences decoded in one batch, through the scheduler with three slots, and after a slot's state is saved,
erased and restored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from arch_parity import check_batched_sequences, check_three_slots_and_restore
from test_engine_parity import Oracle, _check_greedy
from tiny_qwen35 import QWEN35_ATTN_LAYERS, write_tiny_qwen35

from llama_engine import LLM
from llama_engine.layers import MoE
from llama_engine.layers.delta_net import DeltaNet

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp(request.param)
    return write_tiny_qwen35(d / f"{request.param}.gguf", request.param, seed=4)


@pytest.fixture(scope="module")
def pair(path: Path) -> Iterator[tuple]:
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        yield llm, Oracle(path, "f32")


def test_greedy_text_and_logits_equal_llama_cpp(pair: tuple, path: Path) -> None:
    model = pair[0].engine.model
    kinds = [isinstance(layer.mixer, DeltaNet) for layer in model.layers]
    assert kinds == [il not in QWEN35_ATTN_LAYERS for il in range(len(kinds))]
    assert all(isinstance(layer.ffn, MoE) == ("moe" in path.name) for layer in model.layers)
    _check_greedy(*pair, "The capital of France is")


def test_batched_sequences_logits_equal_llama_cpp(path: Path) -> None:
    """Each sequence's conv and delta states its own (``check_batched_sequences``)."""
    check_batched_sequences(path)


def test_scheduler_with_three_slots_and_slot_restore_equal_llama_cpp(tmp_path: Path) -> None:
    """The restored slot continues from its restored conv and delta states (qwen35: the scheduler and
    slot files do not depend on the FFN kind)."""
    path = write_tiny_qwen35(tmp_path / "qwen35.gguf", "qwen35", seed=4)
    check_three_slots_and_restore(path, tmp_path, recurrent=True)
