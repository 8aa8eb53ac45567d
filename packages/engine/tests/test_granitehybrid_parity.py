"""granitehybrid (Mamba-2 layers mixed with attention layers) against llama.cpp's generic build (`nox -s
parity`).

Tiny random-weight models written with gguf-io: seven layers, attention at 1 and 4, the others Mamba-2
blocks (two groups, eight heads) whose conv and SSM states live in the memory's recurrent pool; Granite's
four multipliers set. One model has a dense FFN, one a mixture of experts with a shared expert and no
RoPE (``rope.scaling.finetuned`` false). Tolerance: none. Logits equal to the bit on a prompt and every
greedy step, for several sequences decoded in one batch, through the scheduler with three slots, and
after a slot's state is saved, erased and restored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from arch_parity import check_batched_sequences, check_three_slots_and_restore
from test_engine_parity import Oracle, _check_greedy
from tiny_models import GRANITE_ATTN_LAYERS, write_tiny_model

from gguf_io import GGUFValueType, GGUFWriter
from llama_engine import LLM
from llama_engine.layers import Mamba2, MoE

pytestmark = pytest.mark.parity

N_STEPS = 8


def _no_rope(w: GGUFWriter, rng: np.random.Generator) -> None:
    w.add_metadata("granitehybrid.rope.scaling.finetuned", False, GGUFValueType.BOOL)


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("granite") / "dense.gguf", "granitehybrid", seed=5)


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("granite") / "moe.gguf"
    return write_tiny_model(out, "granitehybrid", seed=6, moe=True, extra=_no_rope)


@pytest.fixture(scope="module")
def pair(path: Path) -> Iterator[tuple]:
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        yield llm, Oracle(path, "f32")


def test_greedy_text_and_logits_equal_llama_cpp(pair: tuple) -> None:
    model = pair[0].engine.model
    kinds = [isinstance(layer.mixer, Mamba2) for layer in model.layers]
    assert kinds == [il not in GRANITE_ATTN_LAYERS for il in range(len(kinds))]
    _check_greedy(*pair, "The capital of France is")


def test_batched_sequences_logits_equal_llama_cpp(path: Path) -> None:
    """Each sequence's conv and SSM states its own (``check_batched_sequences``)."""
    check_batched_sequences(path, N_STEPS)


def test_experts_with_shared_expert_and_no_rope_equal_llama_cpp(moe_path: Path) -> None:
    model = check_batched_sequences(moe_path, N_STEPS)
    ffns = [layer.ffn for layer in model.layers]
    assert all(isinstance(f, MoE) and f.shared is not None and f.shared_gate is None for f in ffns)
    assert model.rope_dims(GRANITE_ATTN_LAYERS[0]) == 0


def test_scheduler_with_three_slots_and_slot_restore_equal_llama_cpp(path: Path, tmp_path: Path) -> None:
    """The restored slot continues from its restored conv and SSM states."""
    check_three_slots_and_restore(path, tmp_path, N_STEPS, recurrent=True)
