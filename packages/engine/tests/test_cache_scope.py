"""Cache scopes (`GenerationRequest.cache_scope`, one per API key): a cached prefix serves only requests of
the scope that computed it. Another scope's request reuses nothing of it (on the same slot, from another
slot, from the RAM prompt cache, from a shared drafting table), so its counters tell nothing about the
other scope's prompts; the scope itself still reuses its prefix. SmolLM2, the scheduler driven by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from llama_engine import Engine, EngineConfig, FinalEvent, GenerationRequest, SamplingParams, StopReason
from llama_engine.handles import Generate, RequestHandle
from llama_engine.speculative.config import NgramModParams
from llama_engine.speculative.drafter import DraftJob
from llama_engine.speculative.ngram_mod import NgramMod

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
K1, K2 = "scope-of-k1", "scope-of-k2"
TEXT = "The vault code is 4 8 15 16 23 42 and the spare key hides under the third flowerpot."


@pytest.fixture(scope="module")
def prompts(smollm2_tokenizer) -> tuple[list[int], list[int], list[int]]:
    """A secret prompt, a guess that shares all of it but its last 3 tokens, and a guess of the same
    length that shares nothing (SmolLM2 adds no BOS)."""
    secret = smollm2_tokenizer.encode(TEXT, add_special=True, parse_special=False)
    hit = [*secret[:-3], 28, 29, 30]
    miss = [t + 1 for t in secret]
    assert len(hit) == len(miss) == len(secret) > 12
    return secret, hit, miss


def _engine(path: Path, n_parallel: int = 1, **kw) -> Engine:
    return Engine(path, EngineConfig(n_ctx=512, n_parallel=n_parallel, n_batch=64, warmup=False, **kw))


def _run(engine: Engine, prompt: list[int], scope: str = "", slot: int = -1) -> FinalEvent:
    """Run one request alone (the test thread plays the engine loop); its final event."""
    sched = engine.scheduler
    h = RequestHandle()
    req = GenerationRequest(prompt=prompt, max_tokens=1, sampling=GREEDY, slot=slot, cache_scope=scope)
    sched.add(Generate(req, h))
    sched.admit()
    while (step := sched.schedule()) is not None:
        logits, hidden = engine.model.forward(step.batch, engine.kv)
        sched.postprocess(step, logits, hidden)
    assert h.final is not None and h.final.reason == StopReason.LENGTH
    return h.final


def _cached(final: FinalEvent) -> tuple[int, int]:
    """(cache_n, prompt_n) as the server reports them (usage's cached tokens are cache_n)."""
    assert final.usage.cached_tokens == final.timings.cache_n
    return final.timings.cache_n, final.timings.prompt_n


def test_without_scopes_a_guess_reuses_the_secret_prefix(smollm2_path: Path, prompts) -> None:
    """What the scopes prevent: one scope for everyone, a matching guess is told by its cache_n."""
    secret, hit, miss = prompts
    engine = _engine(smollm2_path)
    _run(engine, secret)
    assert _cached(_run(engine, hit))[0] == len(secret) - 3
    assert _cached(_run(engine, miss))[0] == 0


def test_another_scope_reuses_nothing_on_the_same_slot(smollm2_path: Path, prompts) -> None:
    secret, hit, miss = prompts
    engine = _engine(smollm2_path)
    _run(engine, secret, K1)
    assert _cached(_run(engine, secret, K1)) == (len(secret) - 1, 1)  # the scope reuses its own prefix
    guess_hit, guess_miss = _cached(_run(engine, hit, K2)), _cached(_run(engine, miss, K2))
    assert guess_hit == guess_miss == (0, len(secret))
    assert engine.scheduler.slots[0].scope == K2
    assert _cached(_run(engine, miss, K2))[0] == len(secret) - 1  # K2 reuses its own


def test_another_scope_borrows_nothing_from_another_slot(smollm2_path: Path, prompts) -> None:
    secret, hit, _ = prompts
    engine = _engine(smollm2_path, n_parallel=2)
    _run(engine, secret, K1, slot=1)
    # a free choice is not drawn to slot 1 by its matching cache (the least recently used slot wins),
    # and the empty slot it takes borrows nothing from slot 1
    first = _run(engine, hit, K2)
    assert _cached(first) == (0, len(secret)) and first.slot == 0
    assert engine.scheduler.slots[0].scope == K2
    # K1 on slot 0 (K2's cache) borrows its prefix from slot 1, its own
    assert _cached(_run(engine, secret, K1, slot=0))[0] == len(secret) - 1


def test_another_scope_loads_nothing_from_the_ram_cache(smollm2_path: Path, prompts) -> None:
    secret, hit, miss = prompts
    engine = _engine(smollm2_path, cache_ram_mib=64)
    cache = engine.scheduler.prompt_cache
    assert cache is not None
    _run(engine, secret, K1)
    assert _cached(_run(engine, hit, K2)) == (0, len(secret))  # K1's cache went to RAM, not to K2
    assert [s.scope for s in cache.states] == [K1]
    assert _cached(_run(engine, miss, K2)) == (0, len(secret))
    assert _cached(_run(engine, secret, K1))[0] == len(secret) - 1  # K1's state comes back from RAM
    assert [s.scope for s in cache.states] == [K2, K2]  # its hit and its miss
    assert _cached(_run(engine, miss, K2))[0] == len(secret) - 1  # and K2's


def test_the_same_tokens_of_two_scopes_are_two_ram_entries(smollm2_path: Path, prompts) -> None:
    """A state of one scope does not stand in for the same tokens of another (else saving the other's
    would be skipped, and whether it comes back would tell that the first scope sent them)."""
    secret, _, miss = prompts
    engine = _engine(smollm2_path, cache_ram_mib=64)
    cache = engine.scheduler.prompt_cache
    assert cache is not None
    _run(engine, secret, K1)
    _run(engine, miss, K1)  # K1's secret goes to RAM
    _run(engine, secret, K2)  # K1's miss goes to RAM; K2 computes the secret itself
    _run(engine, miss, K1)  # K2's secret goes to RAM beside K1's
    assert sorted((s.scope, s.tokens[: len(secret)] == secret) for s in cache.states) == [
        (K1, True),
        (K2, True),
    ]
    assert _cached(_run(engine, secret, K2))[0] == len(secret) - 1


def test_slot_state_moves_only_within_its_scope(smollm2_path: Path, prompts, tmp_path: Path) -> None:
    """Saving another scope's cache writes an empty state and erasing it reports 0 tokens; a restored
    state belongs to the scope that restored it."""
    secret, hit, _ = prompts
    engine = _engine(smollm2_path).start()

    def final(prompt: list[int], scope: str) -> FinalEvent:
        h = engine.submit(GenerationRequest(prompt=prompt, max_tokens=1, sampling=GREEDY, cache_scope=scope))
        for _ in h:
            pass
        assert h.final is not None
        return h.final

    try:
        final(secret, K1)
        assert engine.save_slot(0, tmp_path / "k2", K2).n_tokens == 0
        assert engine.save_slot(0, tmp_path / "k1", K1).n_tokens == len(secret)
        assert engine.erase_slot(0, K2) == 0
        assert engine.restore_slot(0, tmp_path / "k1", K2).n_tokens == len(secret)
        assert engine.slots()[0].scope == K2
        assert final(hit, K2).timings.cache_n == len(secret) - 3  # K1's state, restored by K2: K2's now
    finally:
        engine.shutdown()


def test_the_ngram_mod_table_drafts_only_for_the_scope_that_filled_it() -> None:
    text = list(range(100, 140))
    mod = NgramMod(NgramModParams(n_match=4, n_min=1, n_max=8), size=4096)

    def draft(seq: int) -> list[int]:
        job = DraftJob(seq, text[:20], text[20], 8)
        mod.draft([job])
        return job.result

    mod.begin(0, text, K1)
    assert draft(0) == text[21:29]
    mod.begin(1, [1, 2, 3], K2)  # the table now holds K2's text only
    assert draft(1) == []
    assert draft(0) == []  # K1's sequence neither reads nor fills K2's table
    mod.begin(2, text, K2)
    assert draft(2) == text[21:29]
