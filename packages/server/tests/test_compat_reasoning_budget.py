"""`--reasoning-budget N` and `reasoning_budget_tokens` against a real server: after N thinking tokens the
budget message and the end-of-thinking tag are forced and the answer follows (llama.cpp's current rule).
SmolLM2 with llama.cpp's QwQ template, whose generation prompt opens the thinking block itself."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import click
import httpx
import pytest
from conftest import Server, smollm2_path, sse_events, start_server, stop_server

from llama_server.cli import build_config, main

SRC = Path(os.environ.get("LLAMA_CPP_SRC", Path.home() / ".cache/llama-py/llama-cpp-src-11434.0.0"))
TEMPLATE = SRC / "models/templates/Qwen-QwQ-32B.jinja"
MESSAGE = " Time is up."
ASK = {"messages": [{"role": "user", "content": "What is 12 times 7?"}], "max_tokens": 24}


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    assert TEMPLATE.is_file(), f"llama.cpp's templates are needed ($LLAMA_CPP_SRC): {TEMPLATE}"
    s: Server = start_server(
        tmp_path_factory.mktemp("budget"),
        *("-c", "1024", "-np", "1", "--temp", "0", "--jinja", "--chat-template-file", str(TEMPLATE)),
        *("--reasoning-budget", "6", "--reasoning-budget-message", MESSAGE),
    )
    with s.client() as client:
        yield client
    stop_server(s)


def _first_tokens(c: httpx.Client, n: int) -> str:
    """The model's first n tokens after the chat prompt (greedy), generated freely through /completion."""
    prompt = c.post("/apply-template", json=ASK).json()["prompt"]
    assert prompt.endswith("<think>\n")  # the template opened the block: the budget counts from token 1
    return c.post("/completion", json={"prompt": prompt, "n_predict": n}).json()["content"]


def test_server_budget_forces_the_end_of_thinking(c):
    msg = c.post("/v1/chat/completions", json=ASK).json()["choices"][0]["message"]
    assert msg["reasoning_content"] == _first_tokens(c, 6) + MESSAGE
    raw = c.post("/v1/chat/completions", json={**ASK, "reasoning_format": "none"}).json()
    assert raw["choices"][0]["message"]["content"].startswith(_first_tokens(c, 6) + MESSAGE + "</think>")


def test_request_budget_and_message_override_the_server(c):
    body = {**ASK, "reasoning_budget_tokens": 3, "reasoning_budget_message": ""}
    msg = c.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert msg["reasoning_content"] == _first_tokens(c, 3)
    raw = c.post("/v1/chat/completions", json={**body, "reasoning_format": "none"}).json()
    assert raw["choices"][0]["message"]["content"].startswith(_first_tokens(c, 3) + "</think>")
    alias = {**ASK, "thinking_budget_tokens": 2, "reasoning_budget_message": "!"}
    msg = c.post("/v1/chat/completions", json=alias).json()["choices"][0]["message"]
    assert msg["reasoning_content"] == _first_tokens(c, 2) + "!"


def test_budget_zero_closes_the_block_at_once_and_unlimited_does_not_cut(c):
    zero = c.post("/v1/chat/completions", json={**ASK, "reasoning_budget_tokens": 0}).json()
    assert zero["choices"][0]["message"]["reasoning_content"] in (MESSAGE, MESSAGE.strip())
    free = c.post("/v1/chat/completions", json={**ASK, "reasoning_budget_tokens": 10_000}).json()
    text = (
        free["choices"][0]["message"].get("reasoning_content", "") + free["choices"][0]["message"]["content"]
    )
    assert MESSAGE not in text
    # streamed: the same forced text arrives as reasoning deltas
    r = c.post("/v1/chat/completions", json={**ASK, "stream": True})
    deltas = [json.loads(e)["choices"] for e in sse_events(r.text) if e != "[DONE]"]
    thought = "".join(ch[0]["delta"].get("reasoning_content", "") for ch in deltas if ch)
    assert thought == _first_tokens(c, 6) + MESSAGE


def test_budget_flag_values():
    def cfg(*args: str):
        return build_config(main.make_context("llama-server", ["-m", str(smollm2_path()), *args]).params)

    assert cfg("--reasoning-budget", "0").reasoning == "auto"  # 0 closes the block, thinking stays on
    assert cfg("--reasoning-budget", "5", "--reasoning-budget-message", "x").reasoning_budget_message == "x"
    with pytest.raises(click.BadParameter):
        main.make_context("llama-server", ["-m", str(smollm2_path()), "--reasoning-budget", "-2"])
