"""Prompt caches are per API key: with `--api-key k1,k2`, a prefix k1's requests computed is never reused
for k2 (not on the same slot, another slot, nor from the RAM prompt cache), so k2's `cache_n`,
`prompt_n`, `cached_tokens`, `cache_read_input_tokens` and /slots tell it nothing about k1's prompts,
while k1 still reuses its own prefix (k3 and k4 guess too). A server without keys reuses across requests as llama.cpp does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Server, start_server, stop_server

SECRET = "The vault code is 4 8 15 16 23 42 and the spare key hides under the third flowerpot by the door."
K1, K2, K3, K4 = (
    {"Authorization": f"Bearer k{i}"} for i in range(1, 5)
)  # each test guesses with its own key
BASE = (
    "-c",
    "1024",
    "-n",
    "1",
    "--temp",
    "0",
    "--no-warmup",
    "--api-key",
    "k1,k2,k3,k4",
    "--cache-reuse",
    "4",
)


@pytest.fixture(
    scope="module",
    params=[("-np", "1", "--cache-ram", "0"), ("-np", "2", "-kvu")],
    ids=["one-slot", "two-slots-ram-cache"],
)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("cache-scope"), *BASE, *request.param)
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def _complete(c: httpx.Client, key: dict, prompt: list[int], slot: int = -1) -> dict:
    r = c.post("/completion", headers=key, json={"prompt": prompt, "id_slot": slot, "cache_prompt": True})
    assert r.status_code == 200, r.text
    return r.json()["timings"]


def _prompts(c: httpx.Client) -> tuple[list[int], list[int], list[int]]:
    """k1's secret and k2's two guesses of its length: one sharing all but its last 3 tokens, one
    sharing nothing."""
    r = c.post("/tokenize", headers=K1, json={"content": SECRET})
    secret = r.json()["tokens"]
    return secret, [*secret[:-3], 28, 29, 30], [t + 1 for t in secret]


def test_a_guess_of_another_key_learns_nothing_from_its_cache_n(client: httpx.Client) -> None:
    secret, hit, miss = _prompts(client)
    n = len(secret)
    _complete(client, K1, secret, 0)
    assert _complete(client, K1, secret, 0)["cache_n"] == n - 1  # k1 reuses its own prefix
    # on the slot that holds k1's prompt, then where the server chooses (a key's guesses would reuse its
    # own earlier guesses: another key guesses the second time)
    for key, slot in ((K2, 0), (K3, -1)):
        guesses = [_complete(client, key, p, slot) for p in (hit, miss)]
        assert [(t["cache_n"], t["prompt_n"]) for t in guesses] == [(0, n), (0, n)]
        _complete(client, K1, secret, 0)  # k1's prompt is back on slot 0 before the next round
    assert _complete(client, K1, secret, 0)["cache_n"] == n - 1


def test_openai_and_anthropic_usage_show_no_cache_of_another_key(client: httpx.Client) -> None:
    chat = {"messages": [{"role": "user", "content": SECRET}], "max_tokens": 1}
    first = client.post("/v1/chat/completions", headers=K1, json=chat).json()
    again = client.post("/v1/chat/completions", headers=K1, json=chat).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert again["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"]
    messages = client.post("/v1/messages", headers={"x-api-key": "k4"}, json=chat)
    assert messages.status_code == 200, messages.text
    assert messages.json()["usage"]["cache_read_input_tokens"] == 0
    client.post("/v1/chat/completions", headers=K1, json=chat)  # k1's prompt on the slot again
    legacy = client.post("/v1/completions", headers=K4, json={"prompt": SECRET, "max_tokens": 1}).json()
    assert legacy["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_slots_show_another_key_no_counts(client: httpx.Client) -> None:
    secret, _, _ = _prompts(client)
    _complete(client, K1, secret, 0)
    _complete(client, K1, secret, 0)  # a task with a cache hit
    mine = client.get("/slots", headers=K1).json()[0]
    theirs = client.get("/slots", headers=K4).json()[0]
    assert mine["n_prompt_tokens"] == len(secret) and mine["n_prompt_tokens_cache"] > 0
    assert theirs["n_prompt_tokens"] == theirs["n_prompt_tokens_cache"] == 0
    assert theirs["id_task"] == -1


def test_without_keys_a_prefix_is_reused_across_requests(tmp_path: Path) -> None:
    server = start_server(tmp_path, "-c", "1024", "-n", "1", "--temp", "0", "--no-warmup", "-np", "1")
    try:
        with server.client() as c:
            secret = c.post("/tokenize", json={"content": SECRET}).json()["tokens"]
            _complete(c, {}, secret)
            assert _complete(c, {}, [*secret[:-3], 28, 29, 30])["cache_n"] == len(secret) - 3
            assert _complete(c, {}, [t + 1 for t in secret])["cache_n"] == 0
    finally:
        stop_server(server)
