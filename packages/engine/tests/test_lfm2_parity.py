"""lfm2 (short-convolution layers mixed with attention layers) against llama.cpp's generic build (`nox -s
parity`).

A tiny random-weight model written with gguf-io: seven layers, attention at 2 and 5, the others short
convolutions of three taps whose state lives in the memory's recurrent pool. Tolerance: none. Logits
equal to the bit on a prompt and every greedy step, for several sequences decoded in one batch, through
the scheduler with three slots, and after a slot's state is saved, erased and restored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from arch_parity import check_batched_sequences, check_three_slots_and_restore
from test_engine_parity import Oracle, _check_greedy
from tiny_models import LFM2_ATTN_LAYERS, write_tiny_model

from llama_engine import LLM
from llama_engine.layers import ShortConv

pytestmark = pytest.mark.parity

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("lfm2") / "lfm2.gguf", "lfm2", seed=4)


@pytest.fixture(scope="module")
def pair(path: Path) -> Iterator[tuple]:
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        yield llm, Oracle(path, "f32")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_and_logits_equal_llama_cpp(pair: tuple, prompt: str) -> None:
    model = pair[0].engine.model
    kinds = [isinstance(layer.mixer, ShortConv) for layer in model.layers]
    assert kinds == [il not in LFM2_ATTN_LAYERS for il in range(len(kinds))]
    _check_greedy(*pair, prompt)


def test_batched_sequences_logits_equal_llama_cpp(path: Path) -> None:
    """Each sequence's conv state its own (``check_batched_sequences``)."""
    check_batched_sequences(path)


def test_scheduler_with_three_slots_and_slot_restore_equal_llama_cpp(path: Path, tmp_path: Path) -> None:
    """The restored slot continues from its restored conv state."""
    check_three_slots_and_restore(path, tmp_path, recurrent=True)
