"""Greedy text and logits against llama.cpp itself, for both real models (run by `nox -s parity`).

The oracle is llama.cpp built from the same source with SIMD off (ggml's generic kernels), with flash
attention off, the configuration whose arithmetic the engine reproduces (docs/engine.md): every prompt with
an f32 KV cache, and a few with an f16 cache (llama.cpp's default) on both sides.
Tolerance: none. Logits must be equal to the bit, so the greedy continuations are identical by
construction; the largest difference seen is printed (`-s`).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from llama_engine import LLM
from llama_engine.batch import Batch

pytestmark = pytest.mark.parity

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "In 1492, Columbus",
    "The three primary colors are",
    "import numpy as np\n\n",
    "Q: What is the boiling point of water?\nA:",
    "Les chats sont",
    "1, 2, 3, 5, 8, 13,",
    "The best way to learn programming is",
]
N_GEN = 64
_QUIET_LOG = None


class Oracle:
    """llama.cpp through llama-cpp-python's low-level API: greedy decoding with logits at each step."""

    def __init__(self, path: str | os.PathLike[str], kv_type: str = "f32") -> None:
        try:
            import llama_cpp
        except ImportError as e:  # pragma: no cover - the parity session installs it
            raise RuntimeError("parity tests need llama-cpp-python (run `nox -s parity`)") from e
        lc = self.lc = llama_cpp
        lc.llama_backend_init()
        global _QUIET_LOG
        if _QUIET_LOG is None:  # llama.cpp keeps the pointer for the whole process: so must we
            _QUIET_LOG = lc.llama_log_callback(lambda *a: None)
        lc.llama_log_set(_QUIET_LOG, ctypes.c_void_p())
        self.model = lc.llama_model_load_from_file(os.fsencode(path), lc.llama_model_default_params())
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
        cp.type_k = cp.type_v = {"f32": 0, "f16": 1}[kv_type]  # GGML_TYPE_F32, GGML_TYPE_F16
        cp.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = lc.llama_init_from_model(self.model, cp)
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.batch = lc.llama_batch_init(512, 0, 1)

    def _decode(self, tokens: list[int], start: int) -> np.ndarray:
        b = self.batch
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, i == len(tokens) - 1
            b.seq_id[i][0] = 0
        b.n_tokens = len(tokens)
        assert self.lc.llama_decode(self.ctx, b) == 0
        ptr = self.lc.llama_get_logits_ith(self.ctx, len(tokens) - 1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
        logits = self._decode(prompt, 0)
        out: list[int] = []
        steps = []
        for _ in range(n):
            steps.append(logits)
            t = int(logits.argmax())
            out.append(t)
            if self.lc.llama_vocab_is_eog(self.vocab, t):
                break
            logits = self._decode([t], len(prompt) + len(out) - 1)
        return out, steps


@pytest.fixture(scope="module", params=["smollm2_path", "gemma3_path"])
def pair(request: pytest.FixtureRequest):
    path = request.getfixturevalue(request.param)
    with LLM(path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        yield llm, Oracle(path, "f32")


@pytest.fixture(scope="module", params=["smollm2_path", "gemma3_path"])
def pair_f16(request: pytest.FixtureRequest):
    path = request.getfixturevalue(request.param)
    with LLM(path, n_ctx=512, n_parallel=1) as llm:  # the default cache type, f16
        yield llm, Oracle(path, "f16")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_and_logits_equal_llama_cpp(pair, prompt: str) -> None:
    _check_greedy(*pair, prompt)


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_f16_cache_greedy_text_and_logits_equal_llama_cpp(pair_f16, prompt: str) -> None:
    _check_greedy(*pair_f16, prompt)


def _check_greedy(llm: LLM, oracle: Oracle, prompt: str) -> None:
    ids = llm.tokenize(prompt)
    expected, ref_logits = oracle.greedy(ids, N_GEN)
    got = list(llm.generate(ids, max_tokens=N_GEN, temperature=0.0))
    eos_dropped = expected[: len(got)] == got and len(expected) == len(got) + 1
    assert got == expected or eos_dropped  # the engine does not emit the end-of-generation token
    model = llm.engine.model
    kv = model.make_kv_cache(512, type_k=llm.engine.kv.type_k, type_v=llm.engine.kv.type_v)
    logits, _ = model.forward(Batch.single(ids), kv)
    worst = 0.0
    for i, ref in enumerate(ref_logits):
        worst = max(worst, float(np.abs(logits[0] - ref).max()))
        if i + 1 < len(expected):
            logits, _ = model.forward(Batch.single([expected[i]], 0, len(ids) + i), kv)
    print(f"\n{prompt!r}: {len(expected)} tokens, max |logit difference| = {worst}")
    assert worst == 0.0
