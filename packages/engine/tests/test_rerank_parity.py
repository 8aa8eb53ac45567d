"""Reranker scores against llama.cpp itself (run by `nox -s parity`): rank pooling on tiny models.

The oracle evaluates each (query, document) prompt with embeddings on and LLAMA_POOLING_TYPE_RANK, as
llama-server does for /rerank, and reads the pooled vector. Tolerance: none, every label score equal to the
bit; the prompts' token ids too.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np
import pytest
from tiny_models import write_tiny_model
from tiny_reranker import write_tiny_reranker

from llama_engine import EmbeddingRequest, Engine, EngineConfig, Pooling
from llama_engine.rerank import rerank_prompt

pytestmark = pytest.mark.parity

QUERY = "Machine learning is"
DOCUMENTS = [
    "A machine is a physical system that uses power to apply forces and control movement.",
    "Learning is the process of acquiring new understanding, knowledge, behaviors, skills.",
    "Machine learning is a field of study in artificial intelligence.",
    "Paris, capitale de la France, est une grande ville européenne.",
    "",
]
_QUIET_LOG = None


class RankOracle:
    """llama.cpp through llama-cpp-python's low-level API, in embedding mode with rank pooling."""

    def __init__(self, path: str | os.PathLike[str], kv_type: int) -> None:
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
        cp.n_ctx = cp.n_batch = cp.n_ubatch = 256
        cp.embeddings = True
        cp.pooling_type = lc.LLAMA_POOLING_TYPE_RANK
        cp.type_k = cp.type_v = kv_type  # GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1
        cp.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = lc.llama_init_from_model(self.model, cp)
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_out = lc.llama_model_n_cls_out(self.model)  # values kept per sequence under rank pooling
        self.batch = lc.llama_batch_init(256, 0, 1)

    def tokenize(self, text: str) -> list[int]:
        buf = (self.lc.llama_token * 1024)()
        raw = text.encode()
        n = self.lc.llama_tokenize(self.vocab, raw, len(raw), buf, 1024, False, True)
        assert n >= 0
        return list(buf[:n])

    def score(self, tokens: list[int]) -> np.ndarray:
        lc, b = self.lc, self.batch
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, i, 1, True
            b.seq_id[i][0] = 0
        b.n_tokens = len(tokens)
        assert lc.llama_decode(self.ctx, b) == 0
        ptr = lc.llama_get_embeddings_seq(self.ctx, 0)
        return np.ctypeslib.as_array(ptr, shape=(self.n_out,)).copy()


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_reranker(tmp_path_factory.mktemp("rerank") / "reranker.gguf")


def _compare(path: Path, kv: str, with_template: bool) -> None:
    oracle = RankOracle(path, {"f32": 0, "f16": 1}[kv])
    engine = Engine(path, EngineConfig(n_ctx=256, cache_type_k=kv, cache_type_v=kv)).start()
    try:
        template = engine.gguf.tokenizer.chat_templates.get("rerank")
        assert (template is not None) == with_template
        worst = 0.0
        for doc in DOCUMENTS:
            tokens = rerank_prompt(engine.tokenizer, template, QUERY, doc)
            if template is not None:
                text = template.replace("{query}", QUERY).replace("{document}", doc)
                assert tokens == oracle.tokenize(text)
            ours = engine.embed(EmbeddingRequest(prompt=tokens, pooling=Pooling.RANK))
            theirs = oracle.score(tokens)
            assert ours.shape == theirs.shape
            worst = max(worst, float(np.abs(ours - theirs).max()))
            assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), (doc, ours[:4], theirs[:4])
        print(f"rank pooling {path.name} kv={kv}: largest difference {worst}")
    finally:
        engine.shutdown()


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_reranker_scores_equal_llamacpp(reranker: Path, kv: str) -> None:
    _compare(reranker, kv, with_template=True)


def test_model_without_head_scores_its_hidden_state(tmp_path: Path) -> None:
    """A plain llama model under rank pooling: the score is the last token's first hidden value."""
    _compare(write_tiny_model(tmp_path / "llama.gguf", "llama", seed=5), "f16", with_template=False)
