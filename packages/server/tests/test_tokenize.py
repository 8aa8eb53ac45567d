"""POST /tokenize and /detokenize."""

from __future__ import annotations

from conftest import assert_error


def test_tokenize_roundtrip(client):
    ids = client.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert ids and all(isinstance(i, int) for i in ids)
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"content": "Hello world"}


def test_tokenize_special_and_pieces(client):
    parsed = client.post("/tokenize", json={"content": "<|im_start|>user"}).json()["tokens"]
    literal = client.post("/tokenize", json={"content": "<|im_start|>user", "parse_special": False}).json()[
        "tokens"
    ]
    assert parsed[0] == 1 and 1 not in literal and len(literal) > len(parsed)
    pieces = client.post("/tokenize", json={"content": "Hi", "with_pieces": True}).json()["tokens"]
    assert pieces == [{"id": pieces[0]["id"], "piece": "Hi"}]
    assert client.post("/tokenize", json={}).json() == {"tokens": []}
    assert client.post("/detokenize", json={}).json() == {"content": ""}


def test_tokenize_mixed(client):
    ids = client.post("/tokenize", json={"content": [1, "Hi"]}).json()["tokens"]
    assert ids[0] == 1 and len(ids) >= 2


def test_bad_tokens(client):
    assert_error(client.post("/detokenize", json={"tokens": ["a"]}), 400)
    assert_error(client.post("/detokenize", json={"tokens": [-1]}), 400)
    assert_error(client.post("/detokenize", json={"tokens": [10**9]}), 400)
