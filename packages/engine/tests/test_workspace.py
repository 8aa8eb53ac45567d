"""The forward pass's workspace: allocated once, reused by every step, the same numbers as fresh buffers."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from tiny_models import N_VOCAB, write_tiny_model

from gguf_io import open as open_gguf
from llama_engine.arch import load_model
from llama_engine.batch import Batch


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory):
    return write_tiny_model(tmp_path_factory.mktemp("ws") / "gemma3.gguf", "gemma3")


def _tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, N_VOCAB, n).tolist()


def test_batches_of_other_sizes_give_the_numbers_of_fresh_buffers(tiny_path) -> None:
    """A step after a larger one (stale rows beyond its own) and one larger than the workspace (which then
    grows) give what a model that never ran anything else gives."""
    a, b, c = _tokens(11, 1), _tokens(3, 2), _tokens(30, 3)
    used = load_model(open_gguf(tiny_path))
    kv = used.make_kv_cache(128, n_seq_max=3, n_ubatch=16, swa_full=True)  # the workspace: 16 tokens
    used.forward(Batch.single(a, 0, all_logits=True), kv)
    small = [x.copy() for x in used.forward(Batch.single(b, 1, all_logits=True), kv)]
    large = [x.copy() for x in used.forward(Batch.single(c, 2, all_logits=True), kv)]
    for tokens, seq, got in ((b, 1, small), (c, 2, large)):
        fresh = load_model(open_gguf(tiny_path))
        want = fresh.forward(
            Batch.single(tokens, seq, all_logits=True), fresh.make_kv_cache(128, 3, swa_full=True)
        )
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_decode_steps_reuse_the_workspace(tiny_path) -> None:
    """Logits and hidden states are views into buffers made once: the same memory every decode step."""
    model = load_model(open_gguf(tiny_path))
    kv = model.make_kv_cache(64, n_ubatch=8)
    model.forward(Batch.single(_tokens(5, 4), 0), kv)
    first = model.forward(Batch.single([7], 0, 5), kv)
    for i in range(6, 10):
        step = model.forward(Batch.single([i], 0, i), kv)
        for now, then in zip(step, first, strict=True):
            assert now.shape == then.shape and np.shares_memory(now, then)


def test_a_decode_step_allocates_no_logits_or_activations(smollm2_path) -> None:
    """On SmolLM2 (a logits row is 192 KiB), the memory a decode step holds at its peak beyond what it held
    before stays under one logits row: no fresh logits, activations or products per step (the least of
    ten steps, so a garbage collection during one does not count). The one allocation left is the
    attention kernel's per-thread scratch (about 143 KiB at these positions, numba's allocator, freed
    when it returns): a fresh logits row on top of it would pass the bound."""
    model = load_model(open_gguf(smollm2_path))
    kv = model.make_kv_cache(256, n_ubatch=32)
    model.forward(Batch.single(_tokens(8, 5), 0), kv)
    for p in range(8, 11):  # the first steps make the buffers and views they reuse
        model.forward(Batch.single([p], 0, p), kv)
    extra = []
    tracemalloc.start()
    try:
        for p in range(11, 21):
            tracemalloc.reset_peak()
            before, _ = tracemalloc.get_traced_memory()
            model.forward(Batch.single([p], 0, p), kv)
            extra.append(tracemalloc.get_traced_memory()[1] - before)
    finally:
        tracemalloc.stop()
    assert min(extra) < model.config.n_vocab * 4, f"bytes held beyond the start per step: {extra}"
