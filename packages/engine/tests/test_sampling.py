"""Sampling chain behaviour that needs no reference implementation (llama.cpp parity lives in
test_sampling_parity.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llama_engine.sampling import (
    DEFAULT_SAMPLERS,
    LLAMA_DEFAULT_SEED,
    DryVocab,
    Sampler,
    SamplingParams,
    kernels,
    parse_samplers,
    ref,
    sorting,
)
from llama_engine.sampling import samplers as s
from llama_engine.sampling.rng import canonical_double, discrete_sample, mt_new, mt_next

N = 1000


def logits_for(seed: int, n: int = N, scale: float = 2.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


def run(sampler: Sampler, steps: int, seed: int = 0) -> list[int]:
    out = []
    for i in range(steps):
        t = sampler.sample(logits_for(seed + i, sampler.n_vocab))
        sampler.accept(t)
        out.append(t)
    return out


# --- parameters ---------------------------------------------------------------------------------


def test_defaults_are_llama_cpp_defaults():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p) == (0.8, 40, 0.95, 0.05, 1.0)
    assert (p.repeat_last_n, p.repeat_penalty, p.presence_penalty, p.frequency_penalty) == (64, 1.0, 0.0, 0.0)
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (0.0, 1.75, 2, 64)
    assert p.dry_sequence_breakers == ("\n", ":", '"', "*")
    assert (p.mirostat, p.mirostat_tau, p.mirostat_eta, p.top_n_sigma) == (0, 5.0, 0.1, -1.0)
    assert (p.xtc_probability, p.xtc_threshold, p.n_probs, p.min_keep) == (0.0, 0.1, 0, 0)
    assert p.seed == LLAMA_DEFAULT_SEED == 0xFFFFFFFF
    assert p.samplers == DEFAULT_SAMPLERS == parse_samplers("edskypmxt")
    assert p.validate() is p


def test_frozen():
    with pytest.raises(AttributeError):
        SamplingParams().top_k = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", math.nan),
        ("top_p", 1.5),
        ("top_p", -0.1),
        ("min_p", 2.0),
        ("xtc_probability", -1.0),
        ("xtc_threshold", 1.1),
        ("typical_p", -0.5),
        ("top_n_sigma", math.nan),
        ("top_k", 2**31),
        ("repeat_last_n", -2),
        ("dry_penalty_last_n", -5),
        ("dry_allowed_length", -1),
        ("repeat_penalty", 0.0),
        ("repeat_penalty", -1.0),
        ("repeat_penalty", math.inf),
        ("frequency_penalty", math.inf),
        ("presence_penalty", math.nan),
        ("dry_multiplier", math.inf),
        ("dry_base", math.nan),
        ("dynatemp_range", math.inf),
        ("dynatemp_exponent", math.nan),
        ("mirostat", 3),
        ("mirostat", -1),
        ("mirostat_tau", math.inf),
        ("mirostat_eta", math.nan),
        ("seed", -2),
        ("seed", 2**32),
        ("n_probs", -1),
        ("n_probs", 10**6),
        ("min_keep", -1),
        ("samplers", ("top_k", "grammar")),
        ("logit_bias", ((-1, 1.0),)),
        ("logit_bias", ((3, math.nan),)),
        ("logit_bias", ((3, math.inf),)),
        ("top_k", 1.5),
    ],
)
def test_validate_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value}).validate()


def test_valid_off_values():
    # values llama.cpp reads as "disabled" are valid
    SamplingParams(
        top_k=-1, top_p=1.0, min_p=0.0, typical_p=5.0, top_n_sigma=-3, seed=-1, temperature=-1
    ).validate()
    SamplingParams(repeat_last_n=-1, dry_penalty_last_n=-1, logit_bias=((1, -math.inf),)).validate()


def test_parse_samplers():
    assert parse_samplers(["Top-K", "nucleus", "TEMP", "typ", "minp", "bogus", "top_n_sigma"]) == (
        "top_k",
        "top_p",
        "temperature",
        "typ_p",
        "min_p",
        "top_n_sigma",
    )
    assert parse_samplers("kz?t") == ("top_k", "temperature")
    assert parse_samplers(["dry", "dry"]) == ("dry", "dry")


# --- determinism and the RNG ---------------------------------------------------------------------


def test_mt19937_reference_value():
    st = mt_new(5489)  # std::mt19937 default seed: the 10000th output is fixed by the standard
    for _ in range(9999):
        mt_next(st)
    assert mt_next(st) == 4123659995


def test_discrete_sample_edges():
    st = mt_new(1)
    before = st.copy()
    assert discrete_sample(st, np.array([1.0], dtype=np.float32), 1) == 0
    np.testing.assert_array_equal(st, before)  # one weight: no draw
    p = np.array([0.0, 1.0, 0.0], dtype=np.float32)
    assert all(discrete_sample(st, p, 3) == 1 for _ in range(50))
    assert 0.0 <= canonical_double(st) < 1.0


def test_same_seed_same_tokens():
    p = SamplingParams(seed=1234, temperature=1.5, top_k=0, top_p=0.99, min_p=0.0)
    a, b = run(Sampler(p, N), 100), run(Sampler(p, N), 100)
    assert a == b
    assert len(set(a)) > 20


def test_different_seed_different_tokens():
    mk = lambda seed: run(Sampler(SamplingParams(seed=seed, temperature=1.5, top_k=0), N), 60)  # noqa: E731
    assert mk(1) != mk(2)


def test_reset_replays_a_fixed_seed():
    sm = Sampler(SamplingParams(seed=7, repeat_penalty=1.3), N)
    first = run(sm, 50)
    sm.reset()
    assert run(sm, 50) == first


def test_default_seed_is_random():
    seeds = {Sampler(SamplingParams(), N).seed for _ in range(4)}
    assert len(seeds) > 1
    assert Sampler(SamplingParams(seed=-1), N).seed != LLAMA_DEFAULT_SEED or True
    assert Sampler(SamplingParams(seed=99), N).seed == 99


# --- greedy, temperature, truncation ------------------------------------------------------------


@pytest.mark.parametrize(
    "params", [dict(temperature=0.0), dict(temperature=-1.0), dict(top_k=1, temperature=5.0)]
)
def test_greedy_is_argmax(params):
    sm = Sampler(SamplingParams(seed=3, **params), N)
    for i in range(30):
        x = logits_for(i)
        assert sm.sample(x) == int(np.argmax(x))


def test_temperature_zero_respects_penalties():
    sm = Sampler(SamplingParams(seed=1, temperature=0.0, repeat_penalty=100.0), 10)
    x = np.arange(10, dtype=np.float32)  # 9 is the best, 8 next
    assert sm.sample(x) == 9
    sm.accept(9)
    assert sm.sample(x) == 8


def test_top_k_and_min_p_restrict_candidates():
    x = logits_for(5)
    sm = Sampler(SamplingParams(seed=1, top_k=5, top_p=1.0, min_p=0.0), N)
    top5 = set(np.argsort(-x)[:5].tolist())
    assert {sm.sample(x) for _ in range(200)} <= top5
    ids, probs = sm.candidates()
    assert set(ids.tolist()) == top5
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=1e-6)
    assert np.all(np.diff(probs) <= 0)


def test_logit_bias_bans_and_ignore_eos():
    x = np.zeros(N, dtype=np.float32)
    x[7] = 50.0
    x[8] = 49.0
    x[9] = 48.0
    sm = Sampler(SamplingParams(seed=1, temperature=0.0, logit_bias=((7, -math.inf),)), N)
    assert sm.sample(x) == 8
    sm = Sampler(SamplingParams(seed=1, temperature=0.0, ignore_eos=True), N, eog_tokens=[7, 8])
    assert sm.sample(x) == 9
    sm = Sampler(SamplingParams(seed=1, temperature=0.0), N, eog_tokens=[7, 8])
    assert sm.sample(x) == 7  # eog tokens only banned with ignore_eos
    sm = Sampler(SamplingParams(seed=1, temperature=0.0), N, suppress_tokens=[7])
    assert sm.sample(x) == 8
    with pytest.raises(ValueError, match="outside the vocabulary"):
        Sampler(SamplingParams(logit_bias=((N, 1.0),)), N)


def test_bad_logits_shape():
    with pytest.raises(ValueError, match="shape"):
        Sampler(SamplingParams(), N).sample(np.zeros(N + 1, dtype=np.float32))


# --- penalties and DRY on crafted histories ------------------------------------------------------


def apply_one(smpl, x: np.ndarray) -> np.ndarray:
    c = s.Candidates(x.shape[0])
    c.ids[:] = np.arange(x.shape[0])
    c.logits[:] = x
    c.n, c.identity = x.shape[0], True
    smpl.apply(c)
    return c.logits.copy()


def test_penalties_arithmetic():
    pen = s.Penalties(10, 4, 2.0, 0.5, 0.25)
    pen.accept(np.array([1, 2, 2, 3], dtype=np.int32))
    x = np.array([0, 2.0, -1.0, 4.0, 5.0, 0, 0, 0, 0, 0], dtype=np.float32)
    y = apply_one(pen, x)
    assert y[1] == 2.0 / 2 - (1 * 0.5 + 0.25)
    assert y[2] == -1.0 * 2 - (2 * 0.5 + 0.25)
    assert y[3] == 4.0 / 2 - (0.5 + 0.25)
    assert y[4] == 5.0  # not in history
    pen.accept(np.array([4], dtype=np.int32))  # window of 4: the first token (1) leaves
    y = apply_one(pen, x)
    assert y[1] == 2.0 and y[4] == 5.0 / 2 - 0.75


def toy_vocab() -> DryVocab:
    pieces = [b"a", b"b", b"c", b"d", b"e", b"\n", b"x:", b"f", b"g", b"h"]
    return DryVocab(pieces, lambda text: [pieces.index(bytes([c])) for c in text if bytes([c]) in pieces])


def test_dry_penalises_the_token_that_extends_a_repeat():
    vocab = toy_vocab()
    dry = s.Dry(vocab.breakers(["\n", ":"]), 2.0, 1.5, 2, 64)
    dry.accept(np.array([0, 1, 2, 3, 7, 0, 1, 2], dtype=np.int32))  # "a b c d f a b c": next "d" repeats
    y = apply_one(dry, np.zeros(10, dtype=np.float32))
    assert y[3] == np.float32(-2.0 * 1.5 ** (3 - 2))
    assert np.count_nonzero(y) == 1


def test_dry_sequence_breakers_stop_repeats():
    vocab = toy_vocab()
    b = vocab.breakers(["\n", ":"])
    assert b.single[5] == 1 and b.single[6] == 1  # "\n" and "x:" contain a breaker
    dry = s.Dry(b, 2.0, 1.5, 2, 64)
    dry.accept(np.array([0, 1, 2, 3, 7, 0, 1, 5, 2], dtype=np.int32))  # a newline before the last token
    y = apply_one(dry, np.zeros(10, dtype=np.float32))
    assert not np.any(y)


def test_dry_needs_a_vocabulary():
    with pytest.raises(ValueError, match="DRY"):
        Sampler(SamplingParams(dry_multiplier=0.8), N)
    Sampler(SamplingParams(dry_multiplier=0.8), 10, vocab=toy_vocab())


def test_dry_in_chain_changes_greedy_choice():
    sm = Sampler(
        SamplingParams(seed=1, temperature=0.0, dry_multiplier=5.0, dry_allowed_length=1),
        10,
        vocab=toy_vocab(),
    )
    sm.accept_many([0, 1, 2, 7, 0, 1])  # "a b c f a b": "c" would extend the repeat
    x = np.zeros(10, dtype=np.float32)
    x[2] = 3.0
    x[4] = 2.0
    assert sm.sample(x) == 4


# --- mirostat, probabilities ---------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat_runs_and_updates_mu(version):
    sm = Sampler(SamplingParams(seed=5, mirostat=version), N)
    run(sm, 30)
    last = sm._chain[-1]
    assert last.mu[0] != np.float32(2 * 5.0)
    sm.reset()
    assert last.mu[0] == np.float32(10.0)


def test_probabilities_pre_and_post_sampling():
    x = logits_for(9)
    sm = Sampler(SamplingParams(seed=2, top_k=3), N)
    pre = sm.sample_with_probs(x, 5)
    order = np.argsort(-x)[:5].tolist()
    assert [t for t, _ in pre.top] == order
    assert all(a >= b for (_, a), (_, b) in zip(pre.top, pre.top[1:], strict=False))
    post = sm.sample_with_probs(x, 5, post_sampling=True)
    assert len(post.top) == 3 and [t for t, _ in post.top] == order[:3]
    np.testing.assert_allclose(sum(q for _, q in post.top), 1.0, rtol=1e-6)
    assert post.prob == dict(post.top)[post.token]
    greedy = Sampler(SamplingParams(seed=2, temperature=0.0), N).sample_with_probs(x, 4, post_sampling=True)
    assert greedy.top == [(int(np.argmax(x)), 1.0)]  # zero probabilities dropped


# --- kernels against their numpy references -------------------------------------------------------


def _fresh(x):
    n = x.shape[0]
    return np.arange(n, dtype=np.int32), x.copy(), np.zeros(n, dtype=np.float32)


@pytest.mark.parametrize("n", [1, 17, 1500, 40000])
def test_kernels_match_reference(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 2).astype(np.float32)
    np.testing.assert_array_equal(sorting.argsort_desc(x, n), ref.argsort_desc(x, n))
    for fn, args in [
        ("softmax", (False, True)),
        ("softmax", (False, False)),
        ("top_k", (False, 40)),
        ("top_p", (False, np.float32(0.9), 3)),
        ("min_p", (False, np.float32(0.05), 0)),
        ("min_p", (False, np.float32(0.05), n + 1)),
    ]:
        a, b = _fresh(x), _fresh(x)
        ra = getattr(kernels, fn)(*a, n, *args)
        rb = getattr(ref, fn)(*b, n, *args)
        assert ra == rb, fn
        m = ra[0] if isinstance(ra, tuple) else (ra if fn != "softmax" else n)
        np.testing.assert_array_equal(a[0][:m], b[0][:m], err_msg=fn)
        np.testing.assert_array_equal(a[1][:m], b[1][:m], err_msg=fn)
        np.testing.assert_allclose(a[2][:m], b[2][:m], rtol=1e-6, err_msg=fn)
    for t in (np.float32(0.0), np.float32(0.7)):
        a, b = x.copy(), x.copy()
        kernels.temp(a, n, t)
        ref.temp(b, n, t)
        np.testing.assert_array_equal(a, b)
    a, b = x.copy(), x.copy()
    kernels.top_n_sigma(a, n, np.float32(1.0))
    ref.top_n_sigma(b, n, np.float32(1.0))
    np.testing.assert_array_equal(a, b)
    counts = rng.integers(0, 3, n).astype(np.int32)
    ids = rng.permutation(n).astype(np.int32)
    a, b = x.copy(), x.copy()
    ring, meta, mark = np.zeros(1, np.int32), np.zeros(3, np.int64), np.zeros(n, np.uint8)
    f = np.float32
    kernels.penalties(ids, a, n, counts, ring, meta, mark, False, f(1.2), f(0.1), f(0.3))
    ref.penalties(ids, b, n, counts, f(1.2), f(0.1), f(0.3))
    np.testing.assert_array_equal(a, b)
    toks = np.array([0, n - 1, 0], dtype=np.int32)
    biases = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    a, b = x.copy(), x.copy()
    kernels.logit_bias(ids, a, n, toks, biases)
    ref.logit_bias(ids, b, n, toks, biases)
    np.testing.assert_array_equal(a, b)


def test_warmup_runs():
    from llama_engine.sampling import warmup

    warmup()


@pytest.mark.parametrize("kind", ["random", "ties", "ascending", "descending", "late_best", "with_nan"])
@pytest.mark.parametrize("n", [1000, 4097, 262144])
def test_top_positions_equals_a_stable_sort(kind: str, n: int) -> None:
    """The k best positions, ties to the earlier one, whichever runs of logits the heap skips."""
    rng = np.random.default_rng(n)
    x = {
        "random": lambda: rng.standard_normal(n) * 3,
        "ties": lambda: rng.integers(0, 7, n).astype(np.float64),
        "ascending": lambda: np.arange(n, dtype=np.float64),
        "descending": lambda: -np.arange(n, dtype=np.float64),
        "late_best": lambda: np.where(np.arange(n) > n - 50, 100.0, rng.standard_normal(n)),
        # NaN (never better than the heap's root) after the heap is full
        "with_nan": lambda: np.where(
            (rng.random(n) < 0.01) & (np.arange(n) >= 100), np.nan, rng.standard_normal(n)
        ),
    }[kind]().astype(np.float32)
    for k in (1, 40, 61):
        got = sorting.top_positions(x, n, k)
        finite = np.flatnonzero(~np.isnan(x))
        want = finite[np.argsort(-x[finite], kind="stable")][:k]
        assert got.tolist() == want.tolist()
