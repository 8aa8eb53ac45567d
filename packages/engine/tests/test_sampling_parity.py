"""Parity of the sampling chain with llama.cpp's own samplers (libllama through llama_cpp).

Each llama.cpp sampler is applied to a ``llama_token_data_array`` built here, and the surviving
candidates (ids in order), their logits and their probabilities are compared with ours. Seeded
chains are run step by step over random logits and token histories: the chosen tokens must be
the same at every step.

Tolerance: ids, order, sizes and chosen tokens must be identical; logits and probabilities are
compared with rtol 1e-6 / atol 1e-9 (llama.cpp computes them in float32; the ports reproduce the
operation order, so in practice they agree bit for bit).
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from llama_engine.sampling import DryVocab, Sampler, SamplingParams
from llama_engine.sampling import samplers as s

try:  # the parity session installs llama-cpp-python; elsewhere these tests are deselected (-m "not parity")
    import llama_cpp as L
except ImportError:  # pragma: no cover
    L = None


@pytest.fixture(autouse=True)
def _oracle_present() -> None:
    if L is None:
        raise RuntimeError("parity tests need llama-cpp-python (run `nox -s parity`)")


pytestmark = pytest.mark.parity

RTOL, ATOL = 1e-6, 1e-9
_TD = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
assert L is None or ctypes.sizeof(L.llama_token_data) == _TD.itemsize


# ---------------------------------------------------------------------------------------------
# oracle side


class Oracle:
    """A llama.cpp sampler (or chain) applied to token data arrays built from numpy."""

    def __init__(self, smpl) -> None:
        self.smpl = smpl

    def __del__(self) -> None:
        L.llama_sampler_free(self.smpl)

    def apply(self, logits: np.ndarray, ids: np.ndarray | None = None, is_sorted: bool = False):
        n = logits.shape[0]
        data = np.zeros(n, dtype=_TD)
        data["id"] = np.arange(n, dtype=np.int32) if ids is None else ids
        data["logit"] = logits
        arr = L.llama_token_data_array(ctypes.cast(data.ctypes.data, L.llama_token_data_p), n, -1, is_sorted)
        L.llama_sampler_apply(self.smpl, ctypes.byref(arr))
        start = (ctypes.cast(arr.data, ctypes.c_void_p).value - data.ctypes.data) // _TD.itemsize
        out = data[start : start + arr.size]
        return out["id"].copy(), out["logit"].copy(), out["p"].copy(), int(arr.selected), bool(arr.sorted)

    def accept(self, token: int) -> None:
        L.llama_sampler_accept(self.smpl, token)


def oracle_chain(p: SamplingParams, n_vocab: int, vocab_ptr=None, eog=(), n_ctx: int = 0) -> Oracle:
    """common_sampler_init, rebuilt from the public C API."""
    seed = p.seed & 0xFFFFFFFF
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    add = lambda x: L.llama_sampler_chain_add(chain, x)  # noqa: E731
    bias = list(p.logit_bias) + ([(t, -math.inf) for t in eog] if p.ignore_eos else [])
    if bias:
        arr = (L.llama_logit_bias * len(bias))(*[L.llama_logit_bias(t, b) for t, b in bias])
        add(L.llama_sampler_init_logit_bias(n_vocab, len(bias), arr))
    if p.mirostat == 1:
        add(L.llama_sampler_init_temp(p.temperature))
        add(L.llama_sampler_init_mirostat(n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100))
        return Oracle(chain)
    if p.mirostat == 2:
        add(L.llama_sampler_init_temp(p.temperature))
        add(L.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta))
        return Oracle(chain)
    for name in p.samplers:
        if name == "penalties":
            last_n = n_ctx if p.repeat_last_n == -1 else p.repeat_last_n
            add(
                L.llama_sampler_init_penalties(
                    n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
                )
            )
        elif name == "dry":
            brk = [b.encode() for b in p.dry_sequence_breakers]
            c_brk = (ctypes.c_char_p * len(brk))(*brk)
            add(
                L.llama_sampler_init_dry(
                    vocab_ptr,
                    p.dry_multiplier,
                    p.dry_base,
                    p.dry_allowed_length,
                    p.dry_penalty_last_n,
                    c_brk,
                    len(brk),
                )
            )
        elif name == "top_n_sigma":
            add(L.llama_sampler_init_top_n_sigma(p.top_n_sigma))
        elif name == "top_k":
            add(L.llama_sampler_init_top_k(p.top_k))
        elif name == "typ_p":
            add(L.llama_sampler_init_typical(p.typical_p, p.min_keep))
        elif name == "top_p":
            add(L.llama_sampler_init_top_p(p.top_p, p.min_keep))
        elif name == "min_p":
            add(L.llama_sampler_init_min_p(p.min_p, p.min_keep))
        elif name == "xtc":
            add(L.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, p.min_keep, seed))
        elif name == "temperature":
            add(L.llama_sampler_init_temp_ext(p.temperature, p.dynatemp_range, p.dynatemp_exponent))
    add(L.llama_sampler_init_dist(seed))
    return Oracle(chain)


@pytest.fixture(scope="module")
def smollm_vocab(smollm2_path):
    """SmolLM2's vocabulary through libllama (vocab_only) and the same as a DryVocab."""
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(str(smollm2_path).encode(), mp)
    assert model
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    buf = ctypes.create_string_buffer(256)
    tok = (L.llama_token * 1)()
    pieces = []
    for t in range(n_vocab):
        tok[0] = t
        n = L.llama_detokenize(vocab, tok, 1, buf, 256, False, True)
        assert n >= 0
        pieces.append(buf.raw[:n])

    def tokenize(text: bytes) -> list[int]:
        out = (L.llama_token * (len(text) + 8))()
        n = L.llama_tokenize(vocab, text, len(text), out, len(text) + 8, False, False)
        assert n >= 0
        return list(out[:n])

    yield vocab, DryVocab(pieces, tokenize)
    L.llama_model_free(model)


# ---------------------------------------------------------------------------------------------
# ours


def ours_apply(smpl: s._Sampler, logits: np.ndarray, ids: np.ndarray | None = None, is_sorted: bool = False):
    n = logits.shape[0]
    c = s.Candidates(n)
    c.ids[:] = np.arange(n, dtype=np.int32) if ids is None else ids
    c.logits[:] = logits
    c.n, c.is_sorted, c.identity = n, is_sorted, ids is None
    smpl.apply(c)
    return c.ids[: c.n].copy(), c.logits[: c.n].copy(), c.probs[: c.n].copy(), c.selected, c.is_sorted


def assert_same_candidates(o_ids, o_logits, o_p, r_ids, r_logits, r_p, probs: bool = True) -> None:
    """Same candidates in the same order; among equal logits (e.g. several -inf) any order."""
    assert o_ids.shape == r_ids.shape, f"size {o_ids.shape[0]} != {r_ids.shape[0]}"
    np.testing.assert_allclose(o_logits, r_logits, rtol=RTOL, atol=ATOL)
    if probs:
        np.testing.assert_allclose(o_p, r_p, rtol=RTOL, atol=ATOL)
    _, first, counts = np.unique(r_logits, return_index=True, return_counts=True)
    unique_pos = np.isin(np.arange(r_logits.shape[0]), first[counts == 1])
    np.testing.assert_array_equal(o_ids[unique_pos], r_ids[unique_pos])
    o_key, r_key = np.lexsort((o_ids, o_logits)), np.lexsort((r_ids, r_logits))
    np.testing.assert_array_equal(o_ids[o_key], r_ids[r_key])


def assert_same(ours, ref, probs: bool = True) -> None:
    o_ids, o_logits, o_p, o_sel, o_sorted = ours
    r_ids, r_logits, r_p, r_sel, r_sorted = ref
    assert_same_candidates(o_ids, o_logits, o_p, r_ids, r_logits, r_p, probs)
    assert o_sel == r_sel
    assert o_sorted == r_sorted


def spread(x: np.ndarray, gap: float = 1e-4) -> np.ndarray:
    """x with every two values at least ``gap`` apart: llama.cpp's sorts leave equal logits in an
    unspecified order, and close values could become equal after a temperature division."""
    order = np.argsort(x, kind="stable")
    ramp = np.arange(x.shape[0]) * gap
    xs = np.maximum.accumulate(x[order].astype(np.float64) - ramp) + ramp
    out = np.empty_like(x)
    out[order] = xs.astype(np.float32)
    return out


def random_logits(rng: np.random.Generator, n: int, scale: float = 3.0) -> np.ndarray:
    """Random float32 logits without ties."""
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    return spread(x, 1e-4 if n <= 5000 else 1e-5)


# ---------------------------------------------------------------------------------------------
# one sampler at a time

SIZES = (37, 2000, 49152)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("k", [1, 5, 40, 129, 3000])
def test_top_k(n, k):
    x = random_logits(np.random.default_rng(n + k), n)
    assert_same(ours_apply(s.TopK(k), x), Oracle(L.llama_sampler_init_top_k(k)).apply(x))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("p", [0.0, 0.3, 0.9, 0.995])
@pytest.mark.parametrize("min_keep", [0, 7])
@pytest.mark.parametrize("pre_sorted", [False, True])
def test_top_p(n, p, min_keep, pre_sorted):
    rng = np.random.default_rng(n + int(p * 1000) + min_keep)
    x = random_logits(rng, n, scale=1.0 if n < 100 else 3.0)
    ids = None
    if pre_sorted:  # as after top-k
        order = np.argsort(-x, kind="stable")[:300]
        x, ids = x[order], order.astype(np.int32)
    ours = ours_apply(s.TopP(p, min_keep), x, ids, pre_sorted)
    ref = Oracle(L.llama_sampler_init_top_p(p, min_keep)).apply(x, ids, pre_sorted)
    assert_same(ours, ref)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("p", [0.01, 0.05, 0.5, 1.0])
@pytest.mark.parametrize("min_keep", [0, 3, 100000])
@pytest.mark.parametrize("pre_sorted", [False, True])
def test_min_p(n, p, min_keep, pre_sorted):
    rng = np.random.default_rng(n + int(p * 100) + min_keep)
    x = random_logits(rng, n)
    ids = None
    if pre_sorted:
        order = np.argsort(-x, kind="stable")[:500]
        x, ids = x[order], order.astype(np.int32)
    ours = ours_apply(s.MinP(p, min_keep), x, ids, pre_sorted)
    ref = Oracle(L.llama_sampler_init_min_p(p, min_keep)).apply(x, ids, pre_sorted)
    assert_same(ours, ref)


@pytest.mark.parametrize("n", [37, 2000])
@pytest.mark.parametrize("p", [0.2, 0.5, 0.9, 0.95])
@pytest.mark.parametrize("min_keep", [0, 3])
def test_typical(n, p, min_keep):
    x = random_logits(np.random.default_rng(n + int(p * 100) + min_keep), n, scale=1.5)
    ours = ours_apply(s.Typical(p, min_keep), x)
    assert_same(ours, Oracle(L.llama_sampler_init_typical(p, min_keep)).apply(x))


@pytest.mark.parametrize("t", [0.0, -1.0, 0.25, 0.8, 1.7])
def test_temp(t):
    x = random_logits(np.random.default_rng(7), 2000)
    assert_same(ours_apply(s.Temp(t), x), Oracle(L.llama_sampler_init_temp(t)).apply(x))
    assert_same(
        ours_apply(s.TempExt(t, 0.0, 1.0), x), Oracle(L.llama_sampler_init_temp_ext(t, 0.0, 1.0)).apply(x)
    )


@pytest.mark.parametrize("n", [37, 2000])
@pytest.mark.parametrize(
    ("t", "delta", "exponent"), [(0.8, 0.5, 1.0), (1.0, 0.3, 2.0), (0.3, 0.5, 0.5), (1.2, 2.0, 1.0)]
)
def test_temp_ext_dynamic(n, t, delta, exponent):
    x = random_logits(np.random.default_rng(n), n, scale=1.0)
    ours = ours_apply(s.TempExt(t, delta, exponent), x)
    assert_same(ours, Oracle(L.llama_sampler_init_temp_ext(t, delta, exponent)).apply(x))


@pytest.mark.parametrize("nsig", [0.5, 1.0, 2.5])
@pytest.mark.parametrize("with_inf", [False, True])
def test_top_n_sigma(nsig, with_inf):
    rng = np.random.default_rng(int(nsig * 10))
    x = random_logits(rng, 5000)
    if with_inf:
        x[rng.choice(5000, 300, replace=False)] = -np.inf
    ours = ours_apply(s.TopNSigma(nsig), x)
    assert_same(ours, Oracle(L.llama_sampler_init_top_n_sigma(nsig)).apply(x))


def test_greedy():
    from llama_engine.sampling import kernels

    rng = np.random.default_rng(3)
    for _ in range(20):
        x = random_logits(rng, 3000)
        ref = Oracle(L.llama_sampler_init_greedy()).apply(x)
        assert kernels.greedy(x, x.shape[0]) == ref[3]


@pytest.mark.parametrize(
    ("probability", "threshold", "min_keep"), [(0.5, 0.1, 0), (1.0, 0.05, 0), (0.7, 0.02, 20)]
)
def test_xtc(probability, threshold, min_keep):
    rng = np.random.default_rng(11)
    ours_s = s.Xtc(probability, threshold, min_keep, 1234)
    ref_s = Oracle(L.llama_sampler_init_xtc(probability, threshold, min_keep, 1234))
    for _ in range(60):
        x = random_logits(rng, 40, scale=1.0)
        order = np.argsort(-x, kind="stable")
        x, ids = x[order], order.astype(np.int32)
        assert_same(ours_apply(ours_s, x, ids, True), ref_s.apply(x, ids, True))


def test_logit_bias():
    rng = np.random.default_rng(5)
    n = 1000
    bias = [(3, 1.5), (999, -2.0), (3, 0.25), (500, -math.inf), (0, 7.0)]
    arr = (L.llama_logit_bias * len(bias))(*[L.llama_logit_bias(t, b) for t, b in bias])
    ref_s = Oracle(L.llama_sampler_init_logit_bias(n, len(bias), arr))
    ours_s = s.LogitBias([t for t, _ in bias], [b for _, b in bias])
    x = random_logits(rng, n)
    assert_same(ours_apply(ours_s, x), ref_s.apply(x))
    perm = rng.permutation(n).astype(np.int32)  # shuffled candidates: the search path
    assert_same(ours_apply(ours_s, x[perm], perm), ref_s.apply(x[perm], perm))


@pytest.mark.parametrize(
    ("last_n", "repeat", "freq", "present"),
    [
        (64, 1.1, 0.0, 0.0),
        (64, 1.3, 0.5, 0.25),
        (16, 1.0, 0.2, 0.0),
        (200, 0.8, 0.0, 1.5),
        (1, 1.5, 1.0, 1.0),
    ],
)
def test_penalties(last_n, repeat, freq, present):
    rng = np.random.default_rng(last_n)
    n = 3000
    ours_s = s.Penalties(n, last_n, repeat, freq, present)
    ref_s = Oracle(L.llama_sampler_init_penalties(n, last_n, repeat, freq, present))
    for step in range(150):
        tok = int(rng.integers(0, 40)) if step % 3 else int(rng.integers(0, n))
        ours_s.accept(np.array([tok], dtype=np.int32))
        ref_s.accept(tok)
        if step % 10 == 0:
            x = random_logits(rng, n)
            ref = ref_s.apply(x)
            assert_same(ours_apply(ours_s, x), ref)
            assert np.count_nonzero(ref[1] != x) > 0


def _dry_history(rng: np.random.Generator, breaker_tokens: list[int], length: int) -> list[int]:
    """A history with repeated phrases, sometimes interrupted by breaker tokens."""
    phrases = [rng.integers(100, 5000, size=int(rng.integers(2, 9))).tolist() for _ in range(6)]
    out: list[int] = []
    while len(out) < length:
        r = rng.random()
        if r < 0.6:
            out += phrases[int(rng.integers(0, len(phrases)))]
        elif r < 0.75:
            out.append(breaker_tokens[int(rng.integers(0, len(breaker_tokens)))])
        else:
            out += rng.integers(0, 49152, size=3).tolist()
    return out[:length]


@pytest.mark.parametrize(
    ("multiplier", "base", "allowed", "last_n", "breakers"),
    [
        (0.8, 1.75, 2, 64, ("\n", ":", '"', "*")),
        (1.0, 2.0, 1, 256, ("\n", ":", '"', "*")),
        (0.5, 1.1, 3, 40, ("\n", "Hello world", "</s>", "User:")),
        (2.0, 3.0, 0, 128, ()),
        (0.8, 1.75, 2, 1000, ("\n",)),
    ],
)
def test_dry(smollm_vocab, multiplier, base, allowed, last_n, breakers):
    vocab_ptr, dv = smollm_vocab
    n = dv.n_vocab
    rng = np.random.default_rng(last_n + allowed)
    brk_tokens = [dv.tokenize(b.encode())[0] for b in ("\n", ":", '"', "*", " Hello", "User")]
    c_brk = (ctypes.c_char_p * max(len(breakers), 1))(*[b.encode() for b in breakers])
    ref_s = Oracle(
        L.llama_sampler_init_dry(vocab_ptr, multiplier, base, allowed, last_n, c_brk, len(breakers))
    )
    ours_s = s.Dry(dv.breakers(breakers), multiplier, base, allowed, last_n)
    hist = _dry_history(rng, brk_tokens, 600)
    penalised = 0
    for step, tok in enumerate(hist):
        ours_s.accept(np.array([tok], dtype=np.int32))
        ref_s.accept(tok)
        if step % 25 == 0:
            x = random_logits(rng, n)
            ours, ref = ours_apply(ours_s, x), ref_s.apply(x)
            assert_same(ours, ref)
            penalised += int(np.count_nonzero(ref[1] != x))
    assert penalised > 0  # the histories do trigger DRY


# ---------------------------------------------------------------------------------------------
# whole chains, seeded, step by step


def run_chains(
    p: SamplingParams,
    n_vocab: int,
    steps: int,
    *,
    dv=None,
    vocab_ptr=None,
    eog=(),
    prompt=(),
    scale: float = 2.0,
    data_seed: int = 0,
    check_probs: bool = True,
) -> list[int]:
    """Sample ``steps`` tokens with our Sampler and llama.cpp's chain; they must agree every step."""
    rng = np.random.default_rng(data_seed)
    ours = Sampler(p, n_vocab, vocab=dv, eog_tokens=eog)
    ref = oracle_chain(p, n_vocab, vocab_ptr, eog)
    ours.accept_many(list(prompt))
    for t in prompt:
        ref.accept(t)
    tokens = []
    for step in range(steps):
        x = random_logits(rng, n_vocab, scale)
        if step % 4 == 0 and tokens:  # make repeats likely: boost recent tokens
            x[np.asarray(tokens[-8:])] += np.float32(4.0)
            x = spread(x, 1e-4 if n_vocab <= 5000 else 1e-5)
        r_ids, r_logits, r_p, r_sel, _ = ref.apply(x)
        tok = ours.sample(x)
        assert r_sel >= 0
        assert tok == int(r_ids[r_sel]), f"step {step}: {tok} != {int(r_ids[r_sel])}"
        if check_probs:
            c = ours._cand
            assert_same_candidates(c.ids[: c.n], c.logits[: c.n], c.probs[: c.n], r_ids, r_logits, r_p)
        ours.accept(tok)
        ref.accept(tok)
        tokens.append(tok)
    return tokens


SEEDS = [0, 1, 42, 123456789, 0xFFFFFFFE]


@pytest.mark.parametrize("seed", SEEDS)
def test_chain_default(seed):
    toks = run_chains(SamplingParams(seed=seed), 2000, 250, data_seed=seed)
    assert len(set(toks)) > 10  # really sampling, not always the top token


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_chain_default_large_vocab(seed):
    run_chains(SamplingParams(seed=seed), 49152, 200, data_seed=seed + 1)


CHAINS = {
    "penalties_no_topk": dict(top_k=0, repeat_penalty=1.15, frequency_penalty=0.3, presence_penalty=0.2),
    "temp0": dict(temperature=0.0),
    "temp_only_full_vocab": dict(samplers=("temperature",), temperature=0.7),
    "min_p_unsorted": dict(samplers=("min_p", "temperature"), min_p=0.1, temperature=1.3),
    "top_n_sigma": dict(top_n_sigma=1.0, top_k=0, top_p=1.0, min_p=0.0, temperature=0.9),
    "typical_xtc_dynatemp": dict(
        typical_p=0.9, xtc_probability=0.5, xtc_threshold=0.05, dynatemp_range=0.5, top_k=100
    ),
    "order_tkpm": dict(samplers=("temperature", "top_k", "top_p", "min_p"), temperature=1.5, top_k=20),
    "min_keep": dict(top_p=0.2, min_p=0.5, min_keep=5, top_k=50),
    "top_p_only": dict(samplers=("top_p",), top_p=0.9),
    "logit_bias": dict(logit_bias=((5, 3.0), (17, -math.inf), (5, 1.0), (1999, 8.0)), top_k=10),
    "ignore_eos": dict(ignore_eos=True, top_k=3, temperature=0.2),
    "penalties_after_top_k": dict(
        samplers=("top_k", "penalties", "temperature"),
        top_k=200,
        repeat_penalty=1.3,
        presence_penalty=0.5,
        repeat_last_n=32,
    ),
    "top_k1": dict(top_k=1),
    "mirostat2_low_tau": dict(mirostat=2, mirostat_tau=0.5, mirostat_eta=0.05),
    "mirostat1": dict(mirostat=1, mirostat_tau=4.0, mirostat_eta=0.2),
    "mirostat1_temp": dict(mirostat=1, temperature=0.7),
    "mirostat2": dict(mirostat=2, mirostat_tau=3.0, mirostat_eta=0.1),
    "mirostat2_temp1": dict(mirostat=2, temperature=1.0),
}


@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("seed", [3, 77])
def test_chain_variants(name, seed):
    p = SamplingParams(seed=seed, **CHAINS[name])
    eog = (0, 2) if p.ignore_eos else ()
    run_chains(p, 2000, 200, eog=eog, prompt=list(range(100, 140)), data_seed=seed)


@pytest.mark.parametrize("seed", [5, 99])
@pytest.mark.parametrize("order", ["default", "dry_after_top_k"])
def test_chain_dry(smollm_vocab, seed, order):
    vocab_ptr, dv = smollm_vocab
    p = SamplingParams(seed=seed, dry_multiplier=0.8, repeat_penalty=1.1, top_k=60)
    if order != "default":
        p = SamplingParams(
            seed=seed,
            dry_multiplier=1.5,
            dry_allowed_length=1,
            top_k=300,
            samplers=("top_k", "dry", "temperature"),
        )
    prompt = _dry_history(np.random.default_rng(seed), [198, 28, 1, 19], 300)
    run_chains(p, dv.n_vocab, 200, dv=dv, vocab_ptr=vocab_ptr, prompt=prompt, data_seed=seed)


def test_reset_reseeds_like_llama_cpp():
    p = SamplingParams(seed=9, xtc_probability=0.5, xtc_threshold=0.05)
    rng = np.random.default_rng(1)
    ours = Sampler(p, 500)
    ref = oracle_chain(p, 500)
    for round_ in range(2):
        for _ in range(50):
            x = random_logits(rng, 500)
            r_ids, _, _, r_sel, _ = ref.apply(x)
            assert ours.sample(x) == int(r_ids[r_sel]), round_
        ours.reset()
        L.llama_sampler_reset(ref.smpl)


def test_pre_sampling_probs():
    """n_probs without post_sampling_probs: softmax of the raw logits (server get_token_probabilities)."""
    rng = np.random.default_rng(8)
    x = random_logits(rng, 5000)
    ours = Sampler(SamplingParams(seed=1), 5000)
    res = ours.sample_with_probs(x, 10)
    ref_ids = np.argsort(-x, kind="stable")[:10]
    e = np.exp(x.astype(np.float64) - x.max())
    ref_p = e / e.sum()
    assert [t for t, _ in res.top] == ref_ids.tolist()
    np.testing.assert_allclose([q for _, q in res.top], ref_p[ref_ids], rtol=1e-5)
    np.testing.assert_allclose(res.prob, ref_p[res.token], rtol=1e-5)


def _random_params(rng: np.random.Generator) -> SamplingParams:
    names = ["penalties", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
    order = [names[i] for i in rng.permutation(len(names))[: int(rng.integers(1, len(names) + 1))]]
    if "typ_p" in order and "top_n_sigma" in order:  # -inf logits before typical: NaN entropy in both
        order.remove("top_n_sigma")
    return SamplingParams(
        seed=int(rng.integers(0, 2**32 - 1)),
        samplers=tuple(order),
        temperature=float(rng.choice([0.0, 0.3, 0.8, 1.0, 1.6])),
        dynatemp_range=float(rng.choice([0.0, 0.0, 0.4])),
        dynatemp_exponent=float(rng.choice([1.0, 1.5])),
        top_k=int(rng.choice([0, 1, 5, 40, 300])),
        top_p=float(rng.choice([0.5, 0.9, 0.95, 1.0])),
        min_p=float(rng.choice([0.0, 0.02, 0.1, 0.3])),
        typical_p=float(rng.choice([0.7, 0.95, 1.0])),
        xtc_probability=float(rng.choice([0.0, 0.5, 1.0])),
        xtc_threshold=float(rng.choice([0.02, 0.1, 0.3])),
        top_n_sigma=float(rng.choice([-1.0, 1.0, 2.0])),
        repeat_last_n=int(rng.choice([8, 64, 256])),
        repeat_penalty=float(rng.choice([1.0, 1.1, 1.5])),
        frequency_penalty=float(rng.choice([0.0, 0.4])),
        presence_penalty=float(rng.choice([0.0, 0.6])),
        min_keep=int(rng.choice([0, 0, 2, 10])),
    )


@pytest.mark.parametrize("case", range(60))
def test_chain_random_configurations(case):
    rng = np.random.default_rng(1000 + case)
    p = _random_params(rng)
    n_vocab = int(rng.choice([500, 3000]))
    prompt = rng.integers(0, 60, size=50).tolist()
    run_chains(p, n_vocab, 120, prompt=prompt, data_seed=case, scale=float(rng.choice([1.0, 3.0])))
