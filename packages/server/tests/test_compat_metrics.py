"""/metrics counts prompt tokens as llama-server does: per evaluated batch, so a running request's
prompt is in `prompt_tokens_total` before the request ends, and counted once."""

from __future__ import annotations

import json

import httpx


def _metrics(c: httpx.Client) -> dict[str, float]:
    text = c.get("/metrics").text
    return {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("llamacpp:")}


def test_prompt_tokens_are_counted_while_generating(client: httpx.Client) -> None:
    before = _metrics(client)["llamacpp:prompt_tokens_total"]
    body = {"prompt": "Counting prompt tokens per batch: one two three", "n_predict": 400, "stream": True}
    body |= {"ignore_eos": True, "cache_prompt": False}
    with client.stream("POST", "/completion", json=body) as r:
        lines = r.iter_lines()
        first = next(ln for ln in lines if ln.startswith("data: "))
        assert json.loads(first[6:])["stop"] is False  # the request is still generating
        during = _metrics(client)["llamacpp:prompt_tokens_total"]
        final = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: ")][-1]
    assert final["stop"] is True and final["tokens_predicted"] == 400
    n_prompt = final["timings"]["prompt_n"]
    assert n_prompt > 5 and during - before >= n_prompt  # counted before the request ended
    after = _metrics(client)["llamacpp:prompt_tokens_total"]
    assert after == during  # not counted again when it ends
