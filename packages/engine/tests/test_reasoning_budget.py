"""The reasoning budget (llama.cpp's common/reasoning-budget): counting, forcing the end sequence, UTF-8
completion, natural ends and re-activation, through the real sampler chain."""

from __future__ import annotations

import numpy as np
import pytest

from llama_engine.sampling import ReasoningBudget, ReasoningBudgetParams, Sampler, SamplingParams
from llama_engine.sampling.reasoning_budget import BudgetState, utf8_complete

N = 64
START, END, MSG = (10, 11), (12, 13), (20,)  # multi-token tags, as when the tags are not special tokens


def _params(
    n: int, prefill: tuple[int, ...] = START, forced: tuple[int, ...] = MSG + END
) -> ReasoningBudgetParams:
    return ReasoningBudgetParams(n, START, (END,), forced, prefill)


def _run(sampler: Sampler, favourite: list[int]) -> list[int]:
    """Greedy steps whose logits favour `favourite[i]` at step i: the sampler's choice is accepted."""
    out = []
    for want in favourite:
        logits = np.zeros(N, np.float32)
        logits[want] = 10.0
        t = sampler.sample(logits)
        sampler.accept(t)
        out.append(t)
    return out


def test_budget_forces_message_and_end_tag_then_passes_through():
    s = Sampler(SamplingParams(temperature=0.0, reasoning_budget=_params(3)), N)
    assert s.budget is not None and s.budget.state == BudgetState.COUNTING  # the prefill opened it
    out = _run(s, [1, 2, 3, 4, 5, 6, 7, 8])
    assert out == [1, 2, 3, *MSG, *END, 7, 8]  # 3 free tokens, then the forced sequence, then free again
    assert s.budget.state == BudgetState.DONE


def test_natural_end_stops_the_count_and_a_new_start_restarts_it():
    s = Sampler(SamplingParams(temperature=0.0, reasoning_budget=_params(4)), N)
    out = _run(s, [1, *END, 2, 3, 4, 5, 6])
    assert out == [1, *END, 2, 3, 4, 5, 6]  # closed within budget: nothing forced afterwards
    again = _run(s, [*START, 30, 31, 32, 33, 34, 35, 36, 37])
    assert again == [*START, 30, 31, 32, 33, *MSG, *END, 37]


def test_budget_zero_and_idle_until_the_start_tag():
    s = Sampler(SamplingParams(temperature=0.0, reasoning_budget=_params(0, prefill=())), N)
    assert s.budget is not None and s.budget.state == BudgetState.IDLE
    assert _run(s, [5, 6, *START, 7, 8, 9, 40]) == [5, 6, *START, *MSG, *END, 40]


def test_budget_waits_for_a_whole_utf8_character():
    partial = {3}  # token 3's piece ends inside a character, token 4 completes it
    s = Sampler(
        SamplingParams(temperature=0.0, reasoning_budget=_params(2, forced=END)),
        N,
        complete=lambda t: t not in partial,
    )
    assert _run(s, [1, 3, 4, 5, 6, 7]) == [1, 3, 4, *END, 7]


def test_force_ends_a_counting_block_only():
    b = ReasoningBudget(_params(100), lambda t: True)
    assert b.force() and b.state == BudgetState.FORCING and b.forced == MSG[0]
    idle = ReasoningBudget(_params(100, prefill=()), lambda t: True)
    assert not idle.force() and idle.forced == -1


def test_forced_token_wins_over_the_chain_with_probabilities():
    s = Sampler(SamplingParams(seed=3, temperature=1.0, top_k=5, reasoning_budget=_params(0)), N)
    logits = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    probs = s.sample_with_probs(logits, 5, post_sampling=True)
    assert probs.token == MSG[0] and probs.prob == 1.0 and probs.top == [(MSG[0], 1.0)]


def test_utf8_complete_and_validation():
    assert utf8_complete(b"abc") and utf8_complete("é".encode()) and utf8_complete(b"")
    assert not utf8_complete("é".encode()[:1]) and not utf8_complete("日".encode()[:2])
    assert utf8_complete("日".encode()) and not utf8_complete(b"\x80")
    with pytest.raises(ValueError, match="reasoning budget"):
        SamplingParams(reasoning_budget=ReasoningBudgetParams(-2, START, (END,), END)).validate()
    with pytest.raises(ValueError, match="reasoning budget"):
        SamplingParams(reasoning_budget=ReasoningBudgetParams(1, (), (END,), END)).validate()
