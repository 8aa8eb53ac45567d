"""POST /v1/embeddings (openai SDK) and the native /embedding, /embeddings."""

from __future__ import annotations

import math

import openai
from conftest import assert_error


def test_openai_embeddings(server):
    oai = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    r = oai.embeddings.create(model="my-model", input=["hello", "world"])
    assert len(r.data) == 2 and [d.index for d in r.data] == [0, 1]
    assert len(r.data[0].embedding) == 576
    assert math.isclose(sum(x * x for x in r.data[0].embedding), 1.0, rel_tol=1e-3)
    assert r.model == "my-model" and r.usage.prompt_tokens == r.usage.total_tokens > 0


def test_base64(client):
    r = client.post("/v1/embeddings", json={"input": "hello", "encoding_format": "base64"}).json()
    assert isinstance(r["data"][0]["embedding"], str) and r["data"][0]["encoding_format"] == "base64"


def test_native(client):
    r = client.post("/embedding", json={"content": "hello"}).json()
    assert (
        isinstance(r, list)
        and r[0]["index"] == 0
        and len(r[0]["embedding"]) == 1
        and len(r[0]["embedding"][0]) == 576
    )
    assert client.post("/embeddings", json={"input": ["a", "b"]}).json()[1]["index"] == 1


def test_errors(client):
    assert_error(client.post("/v1/embeddings", json={"input": []}), 400)
    assert_error(client.post("/v1/embeddings", json={"input": True}), 400)
    assert_error(client.post("/v1/embeddings", json={"input": "x", "encoding_format": "hex"}), 400)
    assert_error(client.post("/v1/embeddings", json={}), 400)


def test_bodies_are_encoded_vector_by_vector_as_one_encode_would():
    """The bodies are built off the event loop a vector at a time (so the worker never holds the GIL for
    long); the bytes are those of encoding the whole body at once: per-token rows (pooling none), pooled
    vectors, and non-finite values as null."""
    import msgspec
    import numpy as np

    from llama_engine import Pooling
    from llama_server.controllers.embeddings import _native_items, _openai_item
    from llama_server.sse import encode

    rng = np.random.default_rng(7)
    rows = rng.standard_normal((5, 7)).astype(np.float32)
    rows[1, 2], rows[3, 0] = np.nan, np.inf
    pooled = rng.standard_normal(7).astype(np.float32)
    assert encode(_native_items([rows], Pooling.NONE)) == encode([{"index": 0, "embedding": rows.tolist()}])
    assert encode(_native_items([pooled, pooled], Pooling.MEAN)) == encode(
        [{"index": i, "embedding": [pooled.tolist()]} for i in range(2)]
    )
    assert encode(_openai_item(3, pooled, "float")) == encode(
        {"embedding": pooled.tolist(), "index": 3, "object": "embedding"}
    )
    assert msgspec.json.decode(encode(_native_items([rows], Pooling.NONE)))[0]["embedding"][1][2] is None
