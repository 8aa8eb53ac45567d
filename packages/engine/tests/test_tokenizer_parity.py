"""Tokenizer parity with llama.cpp itself (llama-cpp-python's low-level API, vocab-only loads).

Run with `pytest -m parity`. Every corpus string must give identical ids in all four add_special x
parse_special modes, identical detokenized bytes, and every token identical pieces, for both real models and
for SmolLM2's vocabulary re-labelled with other pre-tokenizer names.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
from tokenizer_corpus import corpus

import gguf_io
from llama_engine.tokenizer import Tokenizer

pytestmark = pytest.mark.parity

MODES = [(True, False), (True, True), (False, False), (False, True)]  # (add_special, parse_special)
# SmolLM2's vocabulary under other `tokenizer.ggml.pre` names (llama.cpp accepts any vocabulary for them)
OTHER_PRE = [
    "llama-bpe",
    "qwen2",
    "gpt-2",
    "default",
    "starcoder",
    "falcon",
    "deepseek-coder",
    "deepseek-llm",
    "deepseek-v3",
    "qwen35",
    "tekken",
    "gpt-4o",
    "poro-chat",
    "viking",
    "chameleon",
    "jais-2",
    "bailingmoe",
    "seed-coder",
    "exaone-moe",
    "youtu",
    "spark2_5",
    "minicpm5",
    "ufakzeka",
    "laguna",
    "granite-embed-multi-97m",
    "chatglm-bpe",
    "roberta-bpe",
    "gemma4",
    "sarvam-moe",
    "glm4",
    "command-r",
    "olmo",
    "bloom",
]


class LlamaVocab:
    """A vocab-only llama.cpp model: the reference tokenizer."""

    def __init__(self, llama_cpp, path: Path) -> None:
        self.lib = llama_cpp
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        raw = text.encode("utf-8")
        n = len(raw) + 16
        while True:
            buf = (self.lib.llama_token * n)()
            r = self.lib.llama_tokenize(self.vocab, raw, len(raw), buf, n, add_special, parse_special)
            if r >= 0:
                return list(buf[:r])
            n = -r

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        arr = (self.lib.llama_token * max(1, len(ids)))(*ids)
        n = 64 + 8 * len(ids)
        while True:
            buf = ctypes.create_string_buffer(n)
            r = self.lib.llama_detokenize(self.vocab, arr, len(ids), buf, n, remove_special, unparse_special)
            if r >= 0:
                return buf.raw[:r]
            n = -r

    def piece(self, tid: int, special: bool) -> bytes:
        n = 64
        while True:
            buf = ctypes.create_string_buffer(n)
            r = self.lib.llama_token_to_piece(self.vocab, tid, buf, n, 0, special)
            if r >= 0:
                return buf.raw[:r]
            n = -r

    def close(self) -> None:
        self.lib.llama_model_free(self.model)


@pytest.fixture(scope="module")
def llama_cpp():
    try:
        import llama_cpp
    except ImportError as e:  # selected parity tests must not pass silently
        pytest.fail(f"parity tests need llama-cpp-python (the llama.cpp reference): {e}")
    # keep llama.cpp's load logging off the test output
    callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(lambda *_: None)
    llama_cpp.llama_log_set(callback, None)
    llama_cpp._tokenizer_test_log_callback = callback  # keep alive
    return llama_cpp


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return corpus()


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def pair(request, llama_cpp):
    """(our tokenizer, llama.cpp's) for one real model."""
    path = request.getfixturevalue(f"{request.param}_path")
    ours = request.getfixturevalue(f"{request.param}_tokenizer")
    ref = LlamaVocab(llama_cpp, path)
    yield request.param, ours, ref
    ref.close()


def _mismatches(ours: Tokenizer, ref: LlamaVocab, texts: list[str], modes) -> list[str]:
    bad = []
    for add, parse in modes:
        for s in texts:
            want = ref.tokenize(s, add, parse)
            got = ours.encode(s, add_special=add, parse_special=parse)
            if got != want:
                bad.append(f"add={add} parse={parse} {s!r}: ours {got} llama.cpp {want}")
    return bad


def test_corpus_size(texts):
    assert len(set(texts)) >= 2000


def test_encode_matches(pair, texts):
    name, ours, ref = pair
    bad = _mismatches(ours, ref, texts, MODES)
    assert not bad, f"{name}: {len(bad)} mismatches of {4 * len(texts)}, first: " + "\n".join(bad[:5])


def test_detokenize_matches(pair, texts):
    name, ours, ref = pair
    bad = []
    for s in texts:
        ids = ref.tokenize(s, True, True)
        for remove in (False, True):
            for unparse in (False, True):
                want = ref.detokenize(ids, remove, unparse)
                got = ours.detokenize(ids, remove_special=remove, unparse_special=unparse)
                if got != want:
                    bad.append(f"{s!r} remove={remove} unparse={unparse}: ours {got!r} llama.cpp {want!r}")
        if ours.decode(ids) != ref.detokenize(ids, False, True).decode("utf-8", "replace"):
            bad.append(f"decode {s!r}")
    assert not bad, f"{name}: {len(bad)} mismatches, first: " + "\n".join(bad[:5])


def test_every_piece_matches(pair):
    name, ours, ref = pair
    assert ours.n_vocab == ref.n_vocab
    bad = [
        (tid, special)
        for tid in range(ours.n_vocab)
        for special in (False, True)
        if ours.token_to_piece(tid, special) != ref.piece(tid, special)
    ]
    assert not bad, f"{name}: {len(bad)} pieces differ, first {bad[:10]}"


def test_special_ids_match(pair):
    _, ours, ref = pair
    lib, v = ref.lib, ref.vocab

    def null(x: int) -> int | None:
        return None if x < 0 else x

    assert ours.bos_id == null(lib.llama_vocab_bos(v))
    assert ours.eos_id == null(lib.llama_vocab_eos(v))
    assert ours.eot_id == null(lib.llama_vocab_eot(v))
    assert ours.add_bos == lib.llama_vocab_get_add_bos(v)
    assert ours.add_eos == lib.llama_vocab_get_add_eos(v)
    fim = ours.fim_ids
    for key in ("pre", "suf", "mid", "pad", "rep", "sep"):
        assert fim[key] == null(getattr(lib, f"llama_vocab_fim_{key}")(v)), key
    want_eog = {t for t in range(ref.n_vocab) if lib.llama_vocab_is_eog(v, t)}
    assert set(ours.eog_ids) == want_eog
    for tid in range(ref.n_vocab):
        assert int(ours.token_attr(tid)) == lib.llama_vocab_get_attr(v, tid), tid


def _fields(path: Path) -> list:
    with gguf_io.open(path) as f:
        return list(f.fields.values())


def _variant(llama_cpp, fields: list, path: Path, overrides: dict) -> tuple[Tokenizer, LlamaVocab]:
    """Write `fields` with some keys replaced (value None drops the key); load it both ways."""
    with gguf_io.GGUFWriter(str(path)) as w:
        for field in fields:
            if field.name not in overrides:
                w.add_field(field)
        for key, value in overrides.items():
            if value is not None:
                w.add_metadata(key, value)
    with gguf_io.open(path) as f:
        ours = Tokenizer.from_gguf(f.tokenizer, f.header.name, f.header.architecture)
    return ours, LlamaVocab(llama_cpp, path)


@pytest.fixture(scope="module")
def smollm2_fields(smollm2_path):
    return _fields(smollm2_path)


@pytest.mark.parametrize("pre", OTHER_PRE)
def test_other_pre_tokenizers(pre, smollm2_fields, tmp_path, llama_cpp, texts):
    ours, ref = _variant(llama_cpp, smollm2_fields, tmp_path / "v.gguf", {"tokenizer.ggml.pre": pre})
    try:
        bad = _mismatches(ours, ref, texts, [(True, False), (False, True)])
        assert not bad, f"{pre}: {len(bad)} mismatches, first: " + "\n".join(bad[:5])
        ids = ref.tokenize(" ".join(texts[:300]), True, True)
        for remove, unparse in MODES:
            assert ours.detokenize(ids, remove, unparse) == ref.detokenize(ids, remove, unparse)
    finally:
        ref.close()


def _codepoint_texts() -> list[str]:
    """Every 7th code point up to U+30000, all of planes 14-16 sampled, and known odd ones, each set in
    contexts that reveal its category (letter, digit, punctuation vs symbol, mark, whitespace)."""
    from tokenizer_corpus import unusual_codepoints

    cps = [chr(c) for c in range(0x80, 0x30000, 7) if not 0xD800 <= c < 0xE000]
    cps += [chr(c) for c in range(0xE0000, 0x110000, 997)] + unusual_codepoints()
    texts = []
    for i in range(0, len(cps), 40):
        texts.append(" ".join(f"a{c}b {c}{c}1{c}, {c}'s" for c in cps[i : i + 40]))
    return texts


@pytest.mark.parametrize("pre", ["smollm", "default", "qwen35", "llama-bpe", "deepseek-coder"])
def test_codepoint_categories(pre, smollm2_fields, tmp_path, llama_cpp):
    ours, ref = _variant(llama_cpp, smollm2_fields, tmp_path / "v.gguf", {"tokenizer.ggml.pre": pre})
    try:
        bad = _mismatches(ours, ref, _codepoint_texts(), [(False, False)])
        assert not bad, f"{pre}: {len(bad)} mismatches, first: " + "\n".join(bad[:3])
    finally:
        ref.close()


@pytest.fixture(scope="module")
def gemma3_fields(gemma3_path):
    return _fields(gemma3_path)


VARIANTS = {
    # SPM as llama 2 style models use it: a space before text, BOS and EOS added
    "gemma3-space-prefix": (
        "gemma3",
        {"tokenizer.ggml.add_space_prefix": True, "tokenizer.ggml.add_eos_token": True},
    ),
    # SPM defaults when the file states no flags: add_space_prefix and add_bos on
    "gemma3-defaults": (
        "gemma3",
        {
            k: None
            for k in (
                "tokenizer.ggml.add_space_prefix",
                "tokenizer.ggml.add_bos_token",
                "tokenizer.ggml.add_eos_token",
            )
        },
    ),
    "smollm2-bos-eos": (
        "smollm2",
        {"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True},
    ),
    "smollm2-no-pre": ("smollm2", {"tokenizer.ggml.pre": None, "tokenizer.ggml.bos_token_id": None}),
}


# llama.cpp's per-model-name strip attributes, on SmolLM2's vocabulary plus the tokens they name
EXTRA_TOKENS = ["</s>", "<unk>", "<s>", "<|end|>", "[MASK]"]
VARIANTS["smollm2-phi3-rstrip"] = ("smollm2", {"general.name": "Phi-3 mini"})
VARIANTS["smollm2-modern-bert-lstrip"] = ("smollm2", {"general.name": "modern-bert base"})


def _with_extra_tokens(fields: list) -> list:
    out = []
    for f in fields:
        if f.name == "tokenizer.ggml.tokens":
            f = type(f)(f.name, f.value_type, [*f.value, *EXTRA_TOKENS], f.array_type)
        elif f.name == "tokenizer.ggml.token_type":
            f = type(f)(f.name, f.value_type, [*f.value, *[3] * len(EXTRA_TOKENS)], f.array_type)
        elif f.name == "llama.vocab_size":
            f = type(f)(f.name, f.value_type, f.value + len(EXTRA_TOKENS), f.array_type)
        out.append(f)
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_flag_variants(variant, request, tmp_path, llama_cpp, texts):
    base, overrides = VARIANTS[variant]
    fields = request.getfixturevalue(f"{base}_fields")
    sample = texts[::3]
    if "strip" in variant:
        fields = _with_extra_tokens(fields)
        sample += [f"a {t}  b\t{t}\n c {t}" for t in EXTRA_TOKENS]
    ours, ref = _variant(llama_cpp, fields, tmp_path / "v.gguf", overrides)
    try:
        bad = _mismatches(ours, ref, sample, MODES)
        assert not bad, f"{variant}: {len(bad)} mismatches, first: " + "\n".join(bad[:5])
        for s in texts[::7]:
            ids = ref.tokenize(s, True, True)
            for remove, unparse in MODES:
                assert ours.detokenize(ids, remove, unparse) == ref.detokenize(ids, remove, unparse), s
        assert ours.bos_id == (
            None if ref.lib.llama_vocab_bos(ref.vocab) < 0 else ref.lib.llama_vocab_bos(ref.vocab)
        )
        assert set(ours.eog_ids) == {
            t for t in range(ref.n_vocab) if ref.lib.llama_vocab_is_eog(ref.vocab, t)
        }
    finally:
        ref.close()
