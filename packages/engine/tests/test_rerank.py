"""Rank pooling on the tiny reranker: prompt formatting, the head, chunked prompts, ggml's softmax."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_reranker import RERANK_TEMPLATE, write_tiny_reranker

from llama_engine import EmbeddingRequest, Engine, EngineConfig, Pooling
from llama_engine.rerank import rerank_prompt, soft_max

DOCS = ["A machine", "Learning is the process of acquiring new understanding", "Paris, capitale"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    path = write_tiny_reranker(tmp_path_factory.mktemp("rerank") / "r.gguf")
    e = Engine(path, EngineConfig(n_ctx=256)).start()
    yield e
    e.shutdown()


def test_prompt_from_the_rerank_template(engine: Engine) -> None:
    tok = engine.tokenizer
    assert engine.gguf.tokenizer.chat_templates["rerank"] == RERANK_TEMPLATE
    ids = rerank_prompt(tok, RERANK_TEMPLATE, "q {document}", "d")
    # special tokens in the template are parsed, none are added, and the query is substituted first
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids[1:-1]) == "query: q d\ndocument: d"


def test_prompt_without_template_follows_the_vocabulary_flags(engine: Engine) -> None:
    tok, v = engine.tokenizer, engine.tokenizer.vocab
    ids = rerank_prompt(tok, None, "ab", "cd")
    expect = [v.bos_id] if v.add_bos else []
    expect += tok.encode("ab", add_special=False) + ([v.eos_id] if v.add_eos else [])
    expect += tok.encode("cd", add_special=False) + ([v.eos_id] if v.add_eos else [])
    assert ids == expect


def test_scores_are_label_probabilities_and_differ_by_document(engine: Engine) -> None:
    scores = [
        engine.embed(
            EmbeddingRequest(
                prompt=rerank_prompt(engine.tokenizer, RERANK_TEMPLATE, "Machine", d), pooling=Pooling.RANK
            )
        )
        for d in DOCS
    ]
    for s in scores:
        assert s.shape == (2,) and s.dtype == np.float32
        assert abs(float(s.sum()) - 1.0) < 1e-6 and 0 < s[0] < 1
    assert len({float(s[0]) for s in scores}) == len(DOCS)


def test_a_prompt_in_chunks_scores_as_one(tmp_path: Path, engine: Engine) -> None:
    ids = rerank_prompt(engine.tokenizer, RERANK_TEMPLATE, "Machine learning is", DOCS[1])
    whole = engine.embed(EmbeddingRequest(prompt=ids, pooling=Pooling.RANK))
    small = Engine(engine.gguf.path, EngineConfig(n_ctx=256, n_batch=8)).start()
    try:
        chunked = small.embed(EmbeddingRequest(prompt=ids, pooling=Pooling.RANK))
    finally:
        small.shutdown()
    assert len(ids) > 8 and np.array_equal(whole, chunked)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9])
def test_soft_max(n: int) -> None:
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 3
    e = np.exp(x.astype(np.float64) - x.max())
    np.testing.assert_allclose(soft_max(x), e / e.sum(), rtol=1e-6)
