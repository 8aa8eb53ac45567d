"""/rerank and its aliases against a real server on a tiny reranker (the engine tests' model file), in
the Jina/Cohere and TEI forms: ordering, top_n, return_text, usage, errors, and 501 without --reranking."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import assert_error, start_server, stop_server

ENGINE_TESTS = Path(__file__).resolve().parents[2] / "engine" / "tests"

QUERY = "Machine learning is"
DOCS = [
    "A machine is a physical system that uses power to apply forces and control movement.",
    "Learning is the process of acquiring new understanding, knowledge and skills.",
    "Machine learning is a field of study in artificial intelligence.",
    "Paris, capitale de la France, est une grande ville européenne.",
]
PATHS = ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"]


def _write_reranker(path: Path) -> Path:
    sys.path.insert(0, str(ENGINE_TESTS))  # tiny_reranker imports its sibling tiny_models
    try:
        spec = importlib.util.spec_from_file_location("tiny_reranker", ENGINE_TESTS / "tiny_reranker.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.write_tiny_reranker(path)
    finally:
        sys.path.remove(str(ENGINE_TESTS))


def _n_tokens(query: str, doc: str) -> int:
    """The tiny model's byte tokens of the rerank template's text, plus its <s> and </s>."""
    return len(f"query: {query}\ndocument: {doc}".encode()) + 2


@pytest.fixture(scope="module")
def rr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    tmp = tmp_path_factory.mktemp("rerank")
    model = _write_reranker(tmp / "reranker.gguf")
    s = start_server(tmp, "-m", str(model), "--rerank", "-np", "2", "-a", "tiny-rr")
    with s.client() as c:
        yield c
    stop_server(s)


def _jina(c: httpx.Client, **body) -> dict:
    r = c.post("/rerank", json={"query": QUERY, "documents": DOCS, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_results_sorted_by_score_with_usage(rr: httpx.Client) -> None:
    body = _jina(rr)
    assert list(body) == ["model", "object", "usage", "results"]
    assert body["model"] == "tiny-rr" and body["object"] == "list"
    res = body["results"]
    assert sorted(r["index"] for r in res) == [0, 1, 2, 3]
    assert all(list(r) == ["index", "relevance_score"] for r in res)
    scores = [r["relevance_score"] for r in res]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == 4
    assert all(0 < s < 1 for s in scores)  # the qwen3 head's softmax over (yes, no)
    n = sum(_n_tokens(QUERY, d) for d in DOCS)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}


def test_a_pair_scores_the_same_wherever_it_is(rr: httpx.Client) -> None:
    by_doc = {DOCS[r["index"]]: r["relevance_score"] for r in _jina(rr)["results"]}
    rev = rr.post("/rerank", json={"query": QUERY, "documents": [DOCS[3], DOCS[0], DOCS[0]]}).json()
    got = {r["index"]: r["relevance_score"] for r in rev["results"]}
    assert got == {0: by_doc[DOCS[3]], 1: by_doc[DOCS[0]], 2: by_doc[DOCS[0]]}
    other = rr.post("/rerank", json={"query": "Which city?", "documents": [DOCS[3]]}).json()
    assert other["results"][0]["relevance_score"] != by_doc[DOCS[3]]


@pytest.mark.parametrize("path", PATHS)
def test_aliases_and_model_field(rr: httpx.Client, path: str) -> None:
    r = rr.post(path, json={"query": QUERY, "documents": DOCS, "model": "mine"})
    assert r.status_code == 200
    assert r.json()["model"] == "mine" and r.json()["results"] == _jina(rr)["results"]


@pytest.mark.parametrize("top_n,expected", [(None, 4), (2, 2), (4, 4), (99, 4), (0, 0), ("x", 4)])
def test_top_n(rr: httpx.Client, top_n, expected: int) -> None:
    extra = {} if top_n is None else {"top_n": top_n}
    full = _jina(rr)["results"]
    res = _jina(rr, **extra)["results"]
    assert res == full[:expected]
    tei = rr.post("/rerank", json={"query": QUERY, "texts": DOCS, **extra})
    assert len(tei.json()) == expected


def test_tei_form(rr: httpx.Client) -> None:
    jina = _jina(rr)["results"]
    tei = rr.post("/rerank", json={"query": QUERY, "texts": DOCS}).json()
    assert isinstance(tei, list)
    assert [(t["index"], t["score"]) for t in tei] == [(j["index"], j["relevance_score"]) for j in jina]
    assert all(list(t) == ["index", "score"] for t in tei)
    texts = rr.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True, "top_n": 2}).json()
    assert [t["text"] for t in texts] == [DOCS[t["index"]] for t in tei[:2]]
    # return_text is TEI only; "texts" selects the TEI form even beside "documents"
    plain = _jina(rr, return_text=True)["results"]
    assert all("text" not in r for r in plain)
    both = rr.post("/rerank", json={"query": QUERY, "documents": DOCS[:2], "texts": DOCS}).json()
    assert isinstance(both, list) and len(both) == 2


@pytest.mark.parametrize("documents", [[], None, 123, [1, 2, 3], ["a", 1]])
def test_invalid_documents(rr: httpx.Client, documents) -> None:
    r = rr.post("/rerank", json={"query": QUERY, "documents": documents})
    assert (
        assert_error(r, 400, "invalid_request_error")["message"]
        == '"documents" must be a non-empty string array'
    )


def test_invalid_requests(rr: httpx.Client) -> None:
    r = rr.post("/rerank", json={"documents": DOCS})
    assert assert_error(r, 400)["message"] == '"query" must be provided'
    for q in (None, 1, ["a"]):
        r = rr.post("/rerank", json={"query": q, "documents": DOCS})
        assert assert_error(r, 400)["message"] == '"query" must be a string'
    assert_error(rr.post("/rerank", json={"query": QUERY, "documents": DOCS, "top_n": -1}), 400)
    assert_error(rr.post("/rerank", content=b"{not json", headers={"content-type": "application/json"}), 400)
    assert_error(rr.post("/rerank", json=[QUERY]), 400)
    r = rr.post("/rerank", json={"query": QUERY, "documents": ["x" * 400]})
    assert assert_error(r, 400, "exceed_context_size_error")["n_ctx"] == 128  # 256 over two slots
    assert rr.get("/health").status_code == 200
    assert len(_jina(rr)["results"]) == 4


def test_501_without_reranking(client: httpx.Client) -> None:
    """The shared server runs --embeddings without rank pooling: /rerank is not offered."""
    for path in PATHS:
        r = client.post(path, json={"query": QUERY, "documents": DOCS})
        assert assert_error(r, 501, "not_supported_error")["message"] == (
            "This server does not support reranking. Start it with `--reranking`"
        )
