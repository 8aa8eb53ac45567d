"""`--reasoning-budget N` and `reasoning_budget_tokens` against a real server: after N thinking tokens the
budget message and the end-of-thinking tag are forced and the answer follows (llama.cpp's current rule).
SmolLM2 with llama.cpp's QwQ template, whose generation prompt opens the thinking block itself."""

from __future__ import annotations

import json
from collections.abc import Iterator

import click
import httpx
import numpy as np
import pytest
from conftest import LLAMA_CPP_SRC, Server, smollm2_path, sse_events, start_server, stop_server

from llama_engine.grammar.matcher import GrammarMatcher, compile_grammar
from llama_engine.grammar.triggers import GrammarTrigger, TriggerType
from llama_engine.grammar.vocab import GrammarVocab
from llama_engine.sampling import ReasoningBudgetParams, Sampler, SamplingParams
from llama_engine.sampling.reasoning_budget import UNLIMITED, BudgetState
from llama_server.cli import build_config, main

TEMPLATE = LLAMA_CPP_SRC / "models/templates/Qwen-QwQ-32B.jinja"
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


# -- the budget and a lazy grammar (common_sampler: grammar_should_apply, the end sequence replayed) -------

THINK, END_THINK, EOG = 256, 257, 300


def _lazy_sampler(trigger: GrammarTrigger, grammar: str) -> Sampler:
    """A byte vocabulary (256 + <think>, </think>; 300 ends generation), a lazy grammar and a budget that
    only tracks the thinking block (no count), opened by the generation prompt."""
    pieces = [bytes([i]) for i in range(256)] + [b"<think>", b"</think>"]
    pieces += [b"<unused>"] * (EOG - len(pieces)) + [b"</s>"]
    matcher = GrammarMatcher(
        compile_grammar(grammar), GrammarVocab(pieces, [EOG]), lazy=True, triggers=(trigger,)
    )
    budget = ReasoningBudgetParams(UNLIMITED, (THINK,), ((END_THINK,),), (END_THINK,), (THINK,))
    params = SamplingParams(temperature=0.0, reasoning_budget=budget)
    return Sampler(params, EOG + 1, eog_tokens=[EOG], grammar=matcher)


def _pick(smpl: Sampler, token: int) -> int:
    """Sample with logits that favour `token`."""
    logits = np.zeros(EOG + 1, np.float32)
    logits[token] = 10.0
    out = smpl.sample(logits)
    smpl.accept(out)
    return out


def test_a_lazy_grammar_is_not_triggered_inside_the_thinking_block():
    smpl = _lazy_sampler(GrammarTrigger(type=TriggerType.WORD, value="<tool>"), 'root ::= "<tool>" [0-9]+')
    assert smpl.grammar is not None
    for b in b"I could call <tool>x":  # the trigger word while thinking: nothing is constrained
        assert _pick(smpl, b) == b
    assert smpl.grammar.awaiting
    assert _pick(smpl, END_THINK) == END_THINK
    for b in b"ok <tool>":
        assert _pick(smpl, b) == b
    assert not smpl.grammar.awaiting  # after the block the trigger fires
    assert chr(_pick(smpl, ord("x"))).isdigit()  # and the grammar constrains the answer


def test_the_closing_tag_is_replayed_into_the_grammar():
    """A trigger in the end sequence (here the </think> token itself) fires when the block closes."""
    trigger = GrammarTrigger(type=TriggerType.TOKEN, token=END_THINK)
    smpl = _lazy_sampler(trigger, "root ::= <[257]> [0-9]+")
    assert smpl.grammar is not None
    for b in b"hmm":
        _pick(smpl, b)
    assert smpl.grammar.awaiting
    assert _pick(smpl, END_THINK) == END_THINK
    assert not smpl.grammar.awaiting and chr(_pick(smpl, ord("x"))).isdigit()


def test_a_control_request_forces_the_end_at_the_next_token():
    smpl = _lazy_sampler(GrammarTrigger(type=TriggerType.WORD, value="<tool>"), 'root ::= "<tool>" [0-9]+')
    assert smpl.budget is not None
    _pick(smpl, ord("a"))
    smpl.budget.request_end()  # from another thread: acted on before the next token
    assert _pick(smpl, ord("b")) == END_THINK
    assert smpl.budget.state == BudgetState.DONE
    smpl.budget.request_end()  # no longer thinking: nothing changes
    assert _pick(smpl, ord("c")) == ord("c")
