"""A cached prompt is reused only on an exact token prefix of the new request (the shape of llama.cpp's
issue 27148, where a saved prompt was restored into another user's conversation): with one slot and the
RAM prompt cache, two conversations that share a system prompt and then diverge each reuse exactly their
common prefix, a conversation that comes back is restored from RAM up to its own tokens, and every answer
equals the answer computed without any cache."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from conftest import Server, start_server, stop_server


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = ("-c", "1024", "-np", "1", "--temp", "0", "--no-warmup", "--cache-ram", "64")
    s = start_server(tmp_path_factory.mktemp("prefix"), *args)
    yield s
    stop_server(s)


def _ids(c: httpx.Client, text: str) -> list[int]:
    return list(c.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"])


def _complete(c: httpx.Client, prompt: list[int], cache: bool = True) -> tuple[str, int, list[int]]:
    body = {"prompt": prompt, "n_predict": 6, "cache_prompt": cache, "return_tokens": True}
    r = c.post("/completion", json=body).json()
    return r["content"], r["timings"]["cache_n"], r["tokens"]


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_only_the_exact_common_prefix_is_reused(one_slot: Server) -> None:
    with one_slot.client() as c:
        system = "You are the assistant of a bank. Never reveal one customer's data to another. "
        alice = _ids(c, system + "Alice asks: what is my balance? My account number is 4417.")
        bob = _ids(c, system + "Bob asks: what is my balance? My account is 9921.")
        n_common = _common(alice, bob)
        assert 5 < n_common < min(len(alice), len(bob)) - 5
        answers: dict[str, str] = {}

        answers["alice"], _, a_out = _complete(c, alice)
        answers["bob"], cache_n, b_out = _complete(c, bob)
        assert cache_n == n_common  # the slot held Alice's conversation: only the shared part is kept

        # Alice comes back: her state returns from RAM, up to her own tokens and no further
        follow = [*alice, *a_out, *_ids(c, " And my last deposit?")[1:]]
        answers["follow"], cache_n, f_out = _complete(c, follow)
        # (a cache holds a prompt and its output but the last token, sampled and never evaluated)
        assert cache_n == _common(follow, [*alice, *a_out[:-1]]) > n_common

        # a prompt that shares only the start of the system prompt gets only that start
        eve = _ids(c, system[:40] + " Eve asks for Alice's balance, account 4417.")
        seen = ([*alice, *a_out[:-1]], [*bob, *b_out[:-1]], [*follow, *f_out[:-1]])
        answers["eve"], cache_n, _ = _complete(c, eve)
        assert cache_n == max(_common(eve, h) for h in seen) < n_common

        # every answer is the one computed without any cache
        for name, prompt in (("alice", alice), ("bob", bob), ("follow", follow), ("eve", eve)):
            assert _complete(c, prompt, cache=False)[0] == answers[name], name
