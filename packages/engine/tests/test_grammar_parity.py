"""Grammar parity with llama.cpp itself (libllama through llama-cpp-python; run by `nox -s parity`).

For the same grammar state and the same candidates (SmolLM2's whole vocabulary), the tokens our
grammar keeps are exactly those llama.cpp's grammar sampler does not set to -inf, along random walks
through every grammar of llama.cpp's grammars/ folder (partial UTF-8 pieces and end-of-generation
included), lazy grammars too. Greedy generation under a grammar gives llama.cpp's tokens (a grammar
sampler then greedy, as ``Llama.create_completion(grammar=..., temperature=0)`` builds its chain) on
the f32-cache configuration whose logits the engine reproduces bit for bit.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
from grammar_cases import LLAMA_CPP_SRC

from llama_engine import LLM
from llama_engine.grammar.matcher import GrammarMatcher, compile_grammar
from llama_engine.grammar.triggers import GrammarTrigger, TriggerType, trigger_patterns
from llama_engine.grammar.vocab import GrammarVocab

try:  # the parity session installs llama-cpp-python; elsewhere these tests are deselected (-m "not parity")
    import llama_cpp as L
except ImportError:  # pragma: no cover
    L = None

pytestmark = pytest.mark.parity

_TD = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
GRAMMARS = sorted((LLAMA_CPP_SRC / "grammars").glob("*.gbnf"))
_QUIET_LOG = None


def _lib():
    if L is None:
        raise RuntimeError("parity tests need llama-cpp-python (run `nox -s parity`)")
    global _QUIET_LOG
    L.llama_backend_init()
    if _QUIET_LOG is None:  # llama.cpp keeps the pointer for the whole process: so must we
        _QUIET_LOG = L.llama_log_callback(lambda *a: None)
    L.llama_log_set(_QUIET_LOG, ctypes.c_void_p())
    return L


class OracleVocab:
    """A vocab-only llama.cpp model: its grammar samplers applied to the whole vocabulary."""

    def __init__(self, path: os.PathLike[str]) -> None:
        lib = _lib()
        params = lib.llama_model_default_params()
        params.vocab_only = True
        self.model = lib.llama_model_load_from_file(os.fsencode(path), params)
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n = lib.llama_vocab_n_tokens(self.vocab)

    def grammar(self, text: str):
        return L.llama_sampler_init_grammar(self.vocab, text.encode(), b"root")

    def lazy(self, text: str, triggers: tuple[GrammarTrigger, ...]):
        patterns, tokens = trigger_patterns(triggers)
        c_pat = (ctypes.c_char_p * max(len(patterns), 1))(*[p.encode() for p in patterns])
        c_tok = (L.llama_token * max(len(tokens), 1))(*tokens)
        return L.llama_sampler_init_grammar_lazy_patterns(
            self.vocab, text.encode(), b"root", c_pat, len(patterns), c_tok, len(tokens)
        )

    def kept(self, smpl) -> np.ndarray:
        data = np.zeros(self.n, dtype=_TD)
        data["id"] = np.arange(self.n, dtype=np.int32)
        arr = L.llama_token_data_array(ctypes.cast(data.ctypes.data, L.llama_token_data_p), self.n, -1, False)
        L.llama_sampler_apply(smpl, ctypes.byref(arr))
        return np.isfinite(data["logit"])


@pytest.fixture(scope="module")
def oracle(smollm2_path) -> OracleVocab:
    return OracleVocab(smollm2_path)


@pytest.fixture(scope="module")
def vocab(smollm2_tokenizer) -> GrammarVocab:
    return GrammarVocab.from_tokenizer(smollm2_tokenizer)


def _walk(oracle: OracleVocab, smpl, ours: GrammarMatcher, vocab: GrammarVocab, steps: int, seed: int) -> int:
    """Accept the same random allowed tokens on both sides; the kept sets must agree at every step.
    Pieces that end inside a UTF-8 sequence are preferred when allowed, to cover partial states."""
    rng = np.random.default_rng(seed)
    partial = np.asarray([p[1] > 0 for p in vocab.partials])
    for step in range(steps):
        ref = oracle.kept(smpl)
        mask = ours.allowed()
        got = np.ones(vocab.n_vocab, dtype=bool) if mask is None else mask
        diff = np.flatnonzero(ref != got)
        assert not diff.size, f"step {step}: {[(int(t), vocab.pieces[t], bool(ref[t])) for t in diff[:6]]}"
        choices = np.flatnonzero(ref & ~vocab.eog)
        if not choices.size:
            return step
        odd = choices[partial[choices]]
        t = int(rng.choice(odd if odd.size and rng.random() < 0.3 else choices))
        L.llama_sampler_accept(smpl, t)
        ours.accept(t)
    return steps


@pytest.mark.parametrize("path", GRAMMARS, ids=lambda p: p.name)
def test_kept_tokens_equal_llama_cpp(oracle: OracleVocab, vocab: GrammarVocab, path) -> None:
    text = path.read_text(encoding="utf-8")
    for seed in (0, 1):
        smpl = oracle.grammar(text)
        try:
            _walk(oracle, smpl, GrammarMatcher(compile_grammar(text), vocab), vocab, 25, seed)
        finally:
            L.llama_sampler_free(smpl)


def test_lazy_grammar_equals_llama_cpp(oracle: OracleVocab, vocab: GrammarVocab, smollm2_tokenizer) -> None:
    text = 'root ::= "<tool_call>" [a-z ]+ "</tool_call>"'
    enc = lambda s: smollm2_tokenizer.encode(s, add_special=False)  # noqa: E731
    call = enc("<tool_call>")
    for triggers, generated in [
        ((GrammarTrigger(type=TriggerType.WORD, value="<tool_call>"),), enc("Sure<tool_call>")),
        (
            (GrammarTrigger(type=TriggerType.PATTERN, value=r"[\s\S]*?(<tool_call>)"),),
            enc("Sure, <tool_call>"),
        ),
        (
            (GrammarTrigger(type=TriggerType.PATTERN_FULL, value=r"Sure(<tool_call>)[\s\S]*"),),
            enc("Sure<tool_call>"),
        ),
        ((GrammarTrigger(type=TriggerType.TOKEN, token=call[0]),), enc("Sure") + call),
    ]:
        smpl = oracle.lazy(text, triggers)
        ours = GrammarMatcher(compile_grammar(text), vocab, lazy=True, triggers=triggers)
        try:
            for t in generated:
                mask = ours.allowed()
                assert np.array_equal(
                    oracle.kept(smpl), np.ones(vocab.n_vocab, bool) if mask is None else mask
                )
                L.llama_sampler_accept(smpl, t)
                ours.accept(t)
            assert not ours.awaiting, triggers
            _walk(oracle, smpl, ours, vocab, 8, 3)
        finally:
            L.llama_sampler_free(smpl)


class OracleModel:
    """llama.cpp with an f32 cache and no flash attention; greedy decoding behind a grammar sampler."""

    def __init__(self, path: os.PathLike[str]) -> None:
        lib = _lib()
        self.model = lib.llama_model_load_from_file(os.fsencode(path), lib.llama_model_default_params())
        cp = lib.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 512, 512
        cp.type_k = cp.type_v = 0  # GGML_TYPE_F32
        cp.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = lib.llama_init_from_model(self.model, cp)
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.batch = lib.llama_batch_init(512, 0, 1)

    def generate(self, prompt: list[int], grammar: str, n: int) -> list[int]:
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root"))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        out: list[int] = []
        try:
            tokens, pos = prompt, 0
            for _ in range(n):
                b = self.batch
                for i, t in enumerate(tokens):
                    b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos + i, 1, i == len(tokens) - 1
                    b.seq_id[i][0] = 0
                b.n_tokens = len(tokens)
                assert L.llama_decode(self.ctx, b) == 0
                pos += len(tokens)
                t = L.llama_sampler_sample(chain, self.ctx, -1)  # applies the chain, then accepts t
                if L.llama_vocab_is_eog(self.vocab, t):
                    break
                out.append(t)
                tokens = [t]
        finally:
            L.llama_sampler_free(chain)
        return out


GREEDY_CASES = [
    ("<|im_start|>user\nDescribe a cat as JSON.<|im_end|>\n<|im_start|>assistant\n", "json.gbnf", 40),
    ("<|im_start|>user\nList three fruits.<|im_end|>\n<|im_start|>assistant\n", "list.gbnf", 24),
    ("The answer to 12 * (3 + 4) is ", "arithmetic.gbnf", 12),
    ("Write one English sentence about the sea:", "english.gbnf", 24),
]


@pytest.fixture(scope="module")
def model_pair(smollm2_path):
    with LLM(smollm2_path, n_ctx=512, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        yield llm, OracleModel(smollm2_path)


@pytest.mark.parametrize(("prompt", "name", "n"), GREEDY_CASES, ids=[c[1] for c in GREEDY_CASES])
def test_greedy_generation_under_a_grammar_equals_llama_cpp(
    model_pair, prompt: str, name: str, n: int
) -> None:
    llm, oracle = model_pair
    grammar = (LLAMA_CPP_SRC / "grammars" / name).read_text(encoding="utf-8")
    ids = llm.tokenize(prompt, parse_special=True)
    expected = oracle.generate(ids, grammar, n)
    got = list(llm.generate(ids, max_tokens=n, temperature=0.0, grammar=grammar))
    assert got == expected, (llm.detokenize(got), llm.detokenize(expected))
