"""Logits with every KV cache type pair, flash attention on and off, against llama.cpp (`nox -s parity`).

The oracle is llama.cpp's generic-kernel build (test_engine_parity) with the same ``type_k``, ``type_v`` and
``flash_attn_type``, its attention rotation of block-type caches on (its default). Tolerance: none, every
logit of the prompt and of each greedy step is equal to the bit.

A prompt of 64 tokens or more with flash attention and f16/f32 K and V takes ggml's tiled kernel (the
``LONG`` cases); contexts stay under 512 cells, where its decode would switch to the split-KV variant the
engine does not reproduce (docs/kv-cache.md).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import test_engine_parity as tp
import tiny_models
from tiny_models import write_tiny_model

from gguf_io import open as open_gguf
from llama_engine.arch import load_model
from llama_engine.batch import Batch
from llama_engine.kv_types import kv_type, resolve_flash_attn

pytestmark = pytest.mark.parity

N_CTX = 256
PROMPT = [1, 504, 3575, 282, 4649, 314, 253, 1345, 12, 3, 77, 91, 100, 200, 33, 44, 5, 6, 7, 8]

# (type_k, type_v, flash attention): every type as K with the mul_mat path, every type as V and as K with
# flash attention, and mixed pairs
TINY_PAIRS = [
    *[(k, "f16", "off") for k in ("f32", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")],
    ("q8_0", "f32", "off"),
    ("q4_0", "bf16", "off"),
    ("bf16", "bf16", "off"),
    *[(t, t, "on") for t in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")],
    ("f16", "q8_0", "on"),
    ("q8_0", "f16", "on"),
    ("q4_1", "iq4_nl", "on"),
    ("q5_0", "f32", "on"),
    ("bf16", "q5_1", "on"),
]
LONG = [("f16", "f16", "on"), ("f32", "f32", "on"), ("f32", "f16", "on"), ("q8_0", "q8_0", "on")]
REAL_PAIRS = [
    ("q8_0", "q8_0", "on"),
    ("q4_0", "f16", "off"),
    ("iq4_nl", "q5_1", "on"),
    ("bf16", "bf16", "on"),
    ("f16", "f16", "on"),
]


class TypedOracle(tp.Oracle):
    """llama.cpp with the given cache types and flash attention setting."""

    def __init__(self, path: str | os.PathLike[str], type_k: str, type_v: str, flash: bool) -> None:
        import llama_cpp as lc

        self.lc = lc
        lc.llama_backend_init()
        if tp._QUIET_LOG is None:
            tp._QUIET_LOG = lc.llama_log_callback(lambda *a: None)
        lc.llama_log_set(tp._QUIET_LOG, ctypes.c_void_p())
        self.model = lc.llama_model_load_from_file(os.fsencode(path), lc.llama_model_default_params())
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = N_CTX, N_CTX, N_CTX
        cp.type_k, cp.type_v = int(kv_type(type_k).qtype), int(kv_type(type_v).qtype)
        cp.flash_attn_type = 1 if flash else 0  # ENABLED / DISABLED
        self.ctx = lc.llama_init_from_model(self.model, cp)
        assert self.ctx, "llama.cpp refused the context"
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.batch = lc.llama_batch_init(N_CTX, 0, 1)

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


def _check(path: Path, model, type_k: str, type_v: str, fa: str, n_gen: int, prompt=PROMPT) -> None:
    flash = resolve_flash_attn(fa, type_k, type_v, model.config.head_dim)
    ids = [i % model.config.n_vocab for i in prompt]
    oracle = TypedOracle(path, type_k, type_v, flash)
    try:
        expected, ref_logits = oracle.greedy(ids, n_gen)
    finally:
        oracle.close()
    kv = model.make_kv_cache(N_CTX, type_k=type_k, type_v=type_v, flash_attn=flash)
    logits, _ = model.forward(Batch.single(ids), kv)
    worst = 0.0
    for i, ref in enumerate(ref_logits):
        worst = max(worst, float(np.abs(logits[0] - ref).max()))
        if i + 1 < len(expected):
            logits, _ = model.forward(Batch.single([expected[i]], 0, len(ids) + i), kv)
    print(f"\n{type_k}/{type_v} fa {fa}: {len(ref_logits)} steps, max |logit difference| = {worst}")
    assert worst == 0.0


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, object]]:
    with pytest.MonkeyPatch.context() as mp:  # 64-value heads: block types fit and are rotated
        mp.setattr(tiny_models, "HEAD_DIM", 64)
        path = write_tiny_model(tmp_path_factory.mktemp("kv-parity") / "llama64.gguf", "llama", seed=11)
    yield path, load_model(open_gguf(path), kernels="portable")


@pytest.mark.parametrize(("type_k", "type_v", "fa"), TINY_PAIRS)
def test_tiny_model_logits_equal_llama_cpp(tiny64, type_k: str, type_v: str, fa: str) -> None:
    _check(*tiny64, type_k, type_v, fa, n_gen=8)


@pytest.mark.parametrize(("type_k", "type_v", "fa"), LONG)
def test_tiled_flash_attention_on_a_long_prompt(tiny64, type_k: str, type_v: str, fa: str) -> None:
    _check(*tiny64, type_k, type_v, fa, n_gen=4, prompt=PROMPT * 4)  # 80 tokens: ggml's tiled kernel


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path):
    return smollm2_path, load_model(open_gguf(smollm2_path), kernels="portable")


@pytest.mark.parametrize(("type_k", "type_v", "fa"), REAL_PAIRS)
def test_smollm2_logits_equal_llama_cpp(smollm2, type_k: str, type_v: str, fa: str) -> None:
    _check(*smollm2, type_k, type_v, fa, n_gen=6)


def test_gemma3_quantized_cache_logits_equal_llama_cpp(gemma3_path: Path) -> None:
    """Sliding-window and global layers (two caches in llama.cpp, each rotated), head size 256."""
    _check(gemma3_path, load_model(open_gguf(gemma3_path), kernels="portable"), "q8_0", "q4_0", "on", n_gen=4)
