"""/metrics carries per-request distributions as Prometheus histograms (time to first token, inter-token
latency, end-to-end latency, queue time, prompt and generated lengths), under llama.cpp's prefix and vLLM's
names, and the whole page parses with prometheus_client's own parser."""

from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

NAMES = (
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
)


def _histograms(c: httpx.Client) -> dict[str, dict[str, float]]:
    """name -> {"count", "sum", "buckets" checks}: every histogram of the page, checked for shape."""
    families = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
    out: dict[str, dict[str, float]] = {}
    for prefix in ("llamacpp", "vllm"):
        for name in NAMES:
            fam = families[f"{prefix}:{name}"]
            assert fam.type == "histogram"
            buckets = [s for s in fam.samples if s.name.endswith("_bucket")]
            count = next(s.value for s in fam.samples if s.name.endswith("_count"))
            total = next(s.value for s in fam.samples if s.name.endswith("_sum"))
            counts = [s.value for s in buckets]
            assert counts == sorted(counts)  # cumulative
            assert buckets[-1].labels["le"] == "+Inf" and counts[-1] == count
            if prefix == "vllm":
                assert all(s.labels.get("model_name") for s in fam.samples)
            out[f"{prefix}:{name}"] = {"count": count, "sum": total}
    return out


def test_a_request_is_observed_in_every_histogram(client: httpx.Client) -> None:
    before = _histograms(client)
    body = {"prompt": "Latency histograms: count to twenty.", "n_predict": 12, "stream": True}
    body |= {"ignore_eos": True, "cache_prompt": False}
    with client.stream("POST", "/completion", json=body) as r:
        final = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")][-1]
    assert final["tokens_predicted"] == 12
    n_prompt = final["tokens_evaluated"]
    after = _histograms(client)
    for prefix in ("llamacpp", "vllm"):

        def grew(name: str, prefix: str = prefix) -> tuple[float, float]:
            a, b = after[f"{prefix}:{name}"], before[f"{prefix}:{name}"]
            return a["count"] - b["count"], a["sum"] - b["sum"]

        assert grew("time_to_first_token_seconds")[0] == 1
        n_itl, itl = grew("inter_token_latency_seconds")
        assert n_itl == 11 and itl > 0
        n_e2e, e2e = grew("e2e_request_latency_seconds")
        ttft = grew("time_to_first_token_seconds")[1]
        assert n_e2e == 1 and 0 < ttft <= e2e and itl <= e2e
        n_queue, queue = grew("request_queue_time_seconds")
        assert n_queue == 1 and 0 <= queue <= e2e
        assert grew("request_prompt_tokens") == (1, n_prompt)
        assert grew("request_generation_tokens") == (1, 12)


def test_choices_count_as_requests_and_errors_are_not_observed(client: httpx.Client) -> None:
    before = _histograms(client)
    body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 3, "n": 2}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert client.post("/completion", json={"prompt": [10**9], "n_predict": 2}).status_code == 400
    after = _histograms(client)
    name = "llamacpp:e2e_request_latency_seconds"
    assert after[name]["count"] - before[name]["count"] == 2
