"""Sampling under a grammar, through the engine on a tiny random model: every sampled output (temperature
1, several seeds) is in the grammar's language, seeds reproduce, and the request's other ends (stop
strings, max_tokens, ignore_eos) and options (n_probs, lazy triggers, preserved tokens) still hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tiny_models import write_tiny_model

from llama_engine import LLM, GenerationRequest, SamplingParams, StopReason
from llama_engine.grammar import GrammarError
from llama_engine.requests import FinalEvent, TokenEvent
from llama_engine.sampling import GrammarTrigger, TriggerType

EOS, PAD = 257, 258
# a grammar and the same language as a regular expression (checked independently of the matcher)
GRAMMAR = 'root ::= "(" [a-z]{1,8} ("," [0-9]{1,3}){0,3} ")"'
REGEX = re.compile(r"\([a-z]{1,8}(,[0-9]{1,3}){0,3}\)")


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory):
    path: Path = write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", "llama", seed=3)
    with LLM(path, n_ctx=256, n_parallel=2, n_batch=64) as m:
        yield m


def _run(llm: LLM, **kw) -> tuple[list[int], str, FinalEvent]:
    max_tokens = kw.pop("max_tokens", 64)
    stop = kw.pop("stop", [])
    req = GenerationRequest(
        prompt=[256, 72, 105], max_tokens=max_tokens, sampling=SamplingParams(**kw), stop=stop
    )
    tokens, text, final = [], "", None
    for ev in llm.engine.submit(req):
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token)
            text += ev.text
        else:
            final = ev
    assert final is not None
    return tokens, text + final.text, final


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_sampled_output_is_in_the_language(llm: LLM, seed: int) -> None:
    tokens, text, final = _run(
        llm, grammar=GRAMMAR, temperature=1.0, seed=seed, top_k=0, min_p=0.0, top_p=1.0
    )
    assert final.reason == StopReason.EOS and not final.error
    assert REGEX.fullmatch(text), text
    again = _run(llm, grammar=GRAMMAR, temperature=1.0, seed=seed, top_k=0, min_p=0.0, top_p=1.0)
    assert again[0] == tokens  # same seed, same output


def test_greedy_and_default_chain(llm: LLM) -> None:
    for params in ({"temperature": 0.0}, {"seed": 9}, {"seed": 9, "repeat_penalty": 1.3, "n_probs": 3}):
        _, text, final = _run(llm, grammar=GRAMMAR, **params)
        assert final.reason == StopReason.EOS and REGEX.fullmatch(text), (params, text)


def test_ignore_eos_ends_when_the_grammar_is_complete(llm: LLM) -> None:
    _, text, final = _run(llm, grammar='root ::= "ok" [0-9]', ignore_eos=True, seed=1, temperature=1.0)
    assert final.reason == StopReason.EOS and re.fullmatch(r"ok[0-9]", text)


def test_max_tokens_and_stop_strings_still_end_it(llm: LLM) -> None:
    tokens, text, final = _run(llm, grammar='root ::= [a-c]+ "."', max_tokens=5, seed=1, temperature=1.0)
    assert final.reason == StopReason.LENGTH and len(tokens) == 5 and re.fullmatch(r"[a-c]{5}", text)
    _, text, final = _run(llm, grammar='root ::= "ab" [a-c]* "c."', stop=["c"], seed=1, temperature=1.0)
    assert final.reason == StopReason.STOP_WORD and final.stop_word == "c" and re.fullmatch("ab[ab]*", text)


def test_post_sampling_probs_keep_only_allowed_tokens(llm: LLM) -> None:
    req = GenerationRequest(
        prompt=[256, 72],
        max_tokens=8,
        sampling=SamplingParams(grammar='root ::= [xyz]+ "!"', n_probs=5, temperature=1.0, seed=4, top_k=0),
        post_sampling_probs=True,
    )
    events = [ev for ev in llm.engine.submit(req) if isinstance(ev, TokenEvent)]
    assert events
    for ev in events:
        assert chr(ev.token) in "xyz!" and ev.prob > 0 and len(ev.top) <= 5


def test_lazy_grammar_applies_after_its_trigger(llm: LLM) -> None:
    # the bias makes "x" the likeliest token: it is sampled freely, fires the trigger, then the grammar rules
    trig = GrammarTrigger(type=TriggerType.PATTERN, value="x")
    _, text, final = _run(
        llm,
        grammar='root ::= "x" [0-9] [0-9] "."',
        grammar_lazy=True,
        grammar_triggers=(trig,),
        logit_bias=((ord("x"), 100.0),),
        temperature=1.0,
        seed=2,
    )
    assert final.reason == StopReason.EOS and re.fullmatch(r"x[0-9][0-9]\.", text), text


def test_preserved_tokens_are_output_as_text(llm: LLM) -> None:
    grammar = "root ::= <[258]> [a-z]"
    _, text, _ = _run(llm, grammar=grammar, temperature=0.0)
    assert re.fullmatch("[a-z]", text)  # a special token's text is hidden ...
    _, text, _ = _run(llm, grammar=grammar, temperature=0.0, preserved_tokens=(PAD,))
    assert re.fullmatch("<pad>[a-z]", text)  # ... unless it is preserved


def test_prefill_advances_the_grammar(llm: LLM) -> None:
    _, text, final = _run(
        llm, grammar='root ::= "ab" [0-9]', grammar_prefill=(ord("a"), ord("b")), temperature=0.0
    )
    assert final.reason == StopReason.EOS and re.fullmatch("[0-9]", text)


def test_a_bad_grammar_is_the_callers_error(llm: LLM) -> None:
    bad = GenerationRequest(prompt=[256, 72], sampling=SamplingParams(grammar="root ::= (unclosed"))
    with pytest.raises(GrammarError, match="parse: error parsing grammar"):
        llm.engine.submit(bad)
    with pytest.raises(GrammarError, match="outside the vocabulary"):
        llm.engine.submit(
            GenerationRequest(prompt=[256], sampling=SamplingParams(grammar="root ::= <[9999]>"))
        )
    with pytest.raises(ValueError, match="no triggers set for lazy grammar"):
        SamplingParams(grammar='root ::= "a"', grammar_lazy=True).validate()
    _, text, final = _run(llm, grammar='root ::= "fine"', temperature=0.0)  # the engine goes on serving
    assert text == "fine" and final.reason == StopReason.EOS
