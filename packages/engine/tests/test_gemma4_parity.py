"""gemma4 against llama.cpp's generic build (`nox -s parity`).

A tiny random-weight model in the converter's layout (``tiny_gemma4``): sliding-window and global layers of
different head sizes and RoPE, proportional RoPE, V norms, two layers reading earlier layers' keys and values,
per-layer inputs, output scalars, soft-capped logits. Tolerance: none. Logits equal to the bit on a prompt and
every greedy step (f32 and f16 caches, and a model whose layers have two FFN widths), for several sequences decoded in one batch past the window, and
greedy text through the scheduler with three slots and after a slot's state is saved, erased and restored.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from arch_parity import SEQS, check_batched_sequences, check_three_slots_and_restore
from test_engine_parity import Oracle, _check_greedy
from tiny_gemma4 import GEMMA4_LAYERS, GEMMA4_SHARED_KV, GEMMA4_WINDOW, write_tiny_gemma4
from tiny_models import N_FF

from llama_engine import LLM
from llama_engine.arch.gemma4 import Gemma4

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gemma4(tmp_path_factory.mktemp("gemma4") / "gemma4.gguf", seed=1)


@pytest.mark.parametrize("cache", ["f32", "f16"])
def test_greedy_text_and_logits_equal_llama_cpp(path: Path, cache: str) -> None:
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k=cache, cache_type_v=cache) as llm:
        model = llm.engine.model
        assert isinstance(model, Gemma4)
        stored = list(range(GEMMA4_LAYERS - GEMMA4_SHARED_KV))
        assert sorted(il for p in llm.engine.kv.pools for il in p.layers) == stored  # shared: not stored
        _check_greedy(llm, Oracle(path, cache), "The capital of France is")


def test_layers_of_two_ffn_widths_equal_llama_cpp(tmp_path: Path) -> None:
    """A per-layer feed_forward_length (the sharing layers' FFNs twice as wide): the workspace is sized
    for the widest, the narrower layers use their own width; logits equal on a prompt and every step."""
    wide = write_tiny_gemma4(tmp_path / "gemma4-wide.gguf", seed=2, wide_shared=True)
    with LLM(wide, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        widths = [layer.ffn.n_ff for layer in llm.engine.model.layers]
        n_kv = GEMMA4_LAYERS - GEMMA4_SHARED_KV
        assert widths == [N_FF] * n_kv + [2 * N_FF] * GEMMA4_SHARED_KV
        _check_greedy(llm, Oracle(wide, "f32"), "The capital of France is")


def test_batched_sequences_logits_equal_llama_cpp(path: Path) -> None:
    """``check_batched_sequences``, past the sliding window."""
    assert max(len(s) for s in SEQS) > GEMMA4_WINDOW
    check_batched_sequences(path, n_ctx=256, kernels="portable")


def test_scheduler_with_three_slots_and_slot_restore_equal_llama_cpp(path: Path, tmp_path: Path) -> None:
    check_three_slots_and_restore(path, tmp_path)
