"""`POST /v1/chat/completions/control` with `reasoning_end` against a real server (endpoints.md §5.4): a
running chat completion sent with `reasoning_control: true` has its thinking block ended now (the budget's
closing sequence is forced at the next token), and the answers are llama-server's: success for a request
holding a slot (even once it no longer thinks), "no active completion for this id" for an unknown or
finished one, "reasoning control not enabled for this completion" when the request did not ask for it.
SmolLM2 with llama.cpp's QwQ template, whose generation prompt opens the thinking block itself."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import LLAMA_CPP_SRC, Server, start_server, stop_server

TEMPLATE = LLAMA_CPP_SRC / "models/templates/Qwen-QwQ-32B.jinja"
MESSAGE = " Enough."
ASK = {"messages": [{"role": "user", "content": "Write a long story about a cat."}], "max_tokens": 400}


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    assert TEMPLATE.is_file(), f"llama.cpp's templates are needed ($LLAMA_CPP_SRC): {TEMPLATE}"
    s: Server = start_server(
        tmp_path_factory.mktemp("control"),
        *("-c", "2048", "-np", "2", "--temp", "0", "--jinja", "--chat-template-file", str(TEMPLATE)),
        *("--reasoning-budget-message", MESSAGE),
    )
    with s.client() as client:
        yield client
    stop_server(s)


def _control(c: httpx.Client, cmpl_id: str) -> dict[str, Any]:
    r = c.post("/v1/chat/completions/control", json={"id": cmpl_id, "action": "reasoning_end"})
    assert r.status_code == 200, r.text
    return r.json()


def _stream_with_control(c: httpx.Client, body: dict[str, Any], after: int) -> tuple[str, str, list[dict]]:
    """Stream `body`; after `after` reasoning deltas send reasoning_end (twice). Returns the reasoning,
    the content and the control answers (the last one sent after the stream ended)."""
    answers: list[dict[str, Any]] = []
    reasoning, content, cmpl_id, n = "", "", "", 0
    with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            cmpl_id = chunk["id"]
            for ch in chunk["choices"]:
                reasoning += ch["delta"].get("reasoning_content") or ""
                content += ch["delta"].get("content") or ""
                n += bool(ch["delta"].get("reasoning_content"))
            if n == after and not answers:
                with httpx.Client(base_url=str(c.base_url), timeout=60) as other:
                    answers += [_control(other, cmpl_id), _control(other, cmpl_id)]
    answers.append(_control(c, cmpl_id))
    return reasoning, content, answers


def test_reasoning_end_closes_the_thinking_of_a_running_request(c):
    free = c.post("/v1/chat/completions", json={**ASK, "max_tokens": 60}).json()["choices"][0]["message"]
    assert "reasoning_content" in free and not free.get("content")  # still thinking after 60 tokens
    reasoning, content, answers = _stream_with_control(c, {**ASK, "reasoning_control": True}, after=4)
    # the second answer comes while the closing sequence is forced or the answer runs: still success
    assert answers[:2] == [{"success": True}, {"success": True}]
    assert answers[2] == {"success": False, "message": "no active completion for this id"}
    assert reasoning.endswith(MESSAGE) and content  # the answer followed the forced end
    thought = reasoning[: -len(MESSAGE)]
    assert free["reasoning_content"].startswith(thought) and len(thought) < len(free["reasoning_content"])


def test_reasoning_end_needs_reasoning_control(c):
    reasoning, _, answers = _stream_with_control(c, {**ASK, "max_tokens": 30}, after=2)
    expected = {"success": False, "message": "reasoning control not enabled for this completion"}
    assert answers[0] == expected and MESSAGE not in reasoning


def test_control_bodies_and_unknown_ids(c):
    assert _control(c, "chatcmpl-unknown") == {
        "success": False,
        "message": "no active completion for this id",
    }
    r = c.post("/v1/chat/completions/control", json={"action": "reasoning_end"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "missing completion id"
    r = c.post("/v1/chat/completions/control", json={"id": "x", "action": "pause"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "unknown control action"
    assert c.get("/health").status_code == 200
