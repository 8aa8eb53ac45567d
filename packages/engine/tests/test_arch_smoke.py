"""The shared smoke runner: every architecture, on tiny random weights, must give a cached decode step
equal to a full forward pass, and the same logits alone or batched with other sequences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_models import ARCHES, N_EMBD, N_VOCAB, write_tiny_model

from gguf_io import GGMLQuantizationType
from gguf_io import open as open_gguf
from llama_engine.arch import ARCHITECTURES, UnsupportedArchitectureError, load_model
from llama_engine.batch import Batch


@pytest.fixture(scope="module", params=ARCHES)
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    path = write_tiny_model(tmp_path_factory.mktemp("tiny") / f"{request.param}.gguf", request.param)
    return load_model(open_gguf(path))


def _tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, N_VOCAB, n).tolist()


def test_every_architecture_is_registered() -> None:
    assert set(ARCHES) <= set(ARCHITECTURES)


def test_cached_decode_equals_full_forward(model) -> None:
    seq = _tokens(12, 1)
    kv = model.make_kv_cache(64)
    full = model.forward(Batch.single(seq, all_logits=True), kv)[0].copy()  # a view valid until the next
    kv.clear()
    model.forward(Batch.single(seq[:7]), kv)
    steps = []
    for i in range(7, 12):
        logits, _ = model.forward(Batch.single([seq[i]], 0, i), kv)
        steps.append(logits[0].copy())
    # The same numerics per token whatever the batch: equal to the bit.
    np.testing.assert_array_equal(np.stack(steps), full[7:])
    assert np.isfinite(full).all() and full.std() > 0


def test_batch_invariance_across_sequences(model) -> None:
    a, b = _tokens(9, 2), _tokens(5, 3)
    kv = model.make_kv_cache(64, n_seq_max=2)
    alone = model.forward(Batch.single(a, 0, all_logits=True), kv)[0].copy()
    kv.clear()
    mixed = Batch.concat([Batch.single(b, 1, all_logits=True), Batch.single(a, 0, all_logits=True)])
    together, _ = model.forward(mixed, kv)
    np.testing.assert_array_equal(together[len(b) :], alone)


def test_prefix_shared_between_sequences(model) -> None:
    """seq_cp shares cells: a second sequence continues from the first one's prefix, no recompute."""
    prefix, tail = _tokens(6, 4), _tokens(3, 5)
    kv = model.make_kv_cache(64, n_seq_max=2)
    ref = model.forward(Batch.single(prefix + tail, 0, all_logits=True), kv)[0].copy()
    kv.clear()
    model.forward(Batch.single(prefix, 0), kv)
    kv.seq_cp(0, 1, 0, len(prefix))
    got, _ = model.forward(Batch.single(tail, 1, len(prefix), all_logits=True), kv)
    np.testing.assert_array_equal(got, ref[len(prefix) :])


def test_unknown_architecture_names_the_supported_ones(tmp_path: Path) -> None:
    from gguf_io import GGUFValueType, GGUFWriter

    p = tmp_path / "x.gguf"
    with GGUFWriter(p) as w:
        w.add_metadata("general.architecture", "mamba9")
        for k in ("block_count", "context_length", "embedding_length", "attention.head_count"):
            w.add_metadata(f"mamba9.{k}", 4, GGUFValueType.UINT32)
        w.add_tensor("token_embd.weight", [4, 4], GGMLQuantizationType.F32, np.zeros(16, np.float32))
    with pytest.raises(
        UnsupportedArchitectureError,
        match=r"'mamba9' is not supported; supported: gemma3, (.*, )?lfm2, llama",
    ):
        load_model(open_gguf(p))


def test_mistral3_refuses_ffn_biases(tmp_path: Path) -> None:
    def bias(w, rng) -> None:  # type: ignore[no-untyped-def]
        w.add_tensor("blk.0.ffn_down.bias", [N_EMBD], GGMLQuantizationType.F32, np.zeros(N_EMBD, np.float32))

    path = write_tiny_model(tmp_path / "m.gguf", "mistral3", extra=bias)
    with pytest.raises(ValueError, match=r"layer 0 has FFN biases \(ffn_down\)"):
        load_model(open_gguf(path))


def test_moe_needs_its_expert_counts(tmp_path: Path) -> None:
    def no_used(w, rng) -> None:  # type: ignore[no-untyped-def]
        w._fields.pop("qwen3moe.expert_used_count")

    path = write_tiny_model(tmp_path / "q.gguf", "qwen3moe", extra=no_used)
    with pytest.raises(ValueError, match="expert_used_count"):
        load_model(open_gguf(path))
