"""The vocabulary files llama.cpp ships (`models/ggml-vocab-*.gguf`, no weights) tokenize as llama.cpp does.

Files with `.inp`/`.out` pairs are checked against those pairs, which are llama.cpp's own output (its
tests/test-tokenizer-0.cpp: texts separated by a `__ggml_vocab_test__` line, one line of ids per text,
tokenized with add_special and parse_special off). Files without pairs round-trip a corpus here and, under
`-m parity`, give the same ids as llama.cpp on the shared corpus. A small o200k-style BPE vocabulary written
here checks the `gpt-4o` pre-tokenizer against llama.cpp the same way.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np
import pytest
from tokenizer_corpus import CODE, EMOJI, ENGLISH, SCRIPTS, corpus

import gguf_io
from gguf_io import GGUFValueType, GGUFWriter
from llama_engine.tokenizer import Tokenizer, VocabType
from llama_engine.tokenizer.bpe import BYTE_ENCODER

LLAMA_CPP_SRC = Path(os.environ.get("LLAMA_CPP_SRC", Path.home() / ".cache/llama-py/llama-cpp-src-11434.0.0"))
MODELS = LLAMA_CPP_SRC / "models"
WITH_PAIRS = [
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
]
WITHOUT_PAIRS = ["aquila", "baichuan", "gpt-neox", "nomic-bert-moe"]
_SEPARATOR = "\n__ggml_vocab_test__\n"


def _path(name: str) -> Path:
    path = MODELS / f"ggml-vocab-{name}.gguf"
    assert path.is_file(), f"llama.cpp's vocabulary files are needed ($LLAMA_CPP_SRC): {path}"
    return path


@functools.cache
def _tokenizer(name: str) -> Tokenizer:
    with gguf_io.open(_path(name)) as f:
        return Tokenizer.from_file(f)


def _pairs(name: str) -> list[tuple[str, list[int]]]:
    """test-tokenizer-0's read_tests: the texts of `.inp` and the stripped id lines of `.out`."""
    path = _path(name)
    texts = Path(f"{path}.inp").read_bytes().decode("utf-8").split(_SEPARATOR)
    if texts[-1] == "":
        texts.pop()  # a separator at the very end starts no further text
    lines = Path(f"{path}.out").read_text("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it is not an empty test
    assert len(texts) == len(lines), f"{name}: {len(texts)} texts but {len(lines)} id lines"
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines, strict=True)]


def test_every_shipped_vocabulary_is_covered():
    shipped = {
        p.name.removeprefix("ggml-vocab-").removesuffix(".gguf") for p in MODELS.glob("ggml-vocab-*.gguf")
    }
    with_pairs = {p.name.removeprefix("ggml-vocab-").removesuffix(".gguf.inp") for p in MODELS.glob("*.inp")}
    assert with_pairs == set(WITH_PAIRS)
    assert shipped == set(WITH_PAIRS) | set(WITHOUT_PAIRS)


@pytest.mark.parametrize("name", WITH_PAIRS)
def test_pairs(name):
    tok = _tokenizer(name)
    pairs = _pairs(name)
    bad = []
    for text, want in pairs:
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != want:
            bad.append(f"{text!r}: ours {got} llama.cpp {want}")
    passed = len(pairs) - len(bad)
    assert not bad, f"{name}: {passed}/{len(pairs)} pairs match; first failures:\n" + "\n".join(bad[:5])


def test_model_types():
    """The tokenizer models the files name (gemma-4 is BPE on raw UTF-8 with its own pre-tokenizer)."""
    kinds = {n: _tokenizer(n).vocab.type for n in ("bert-bge", "nomic-bert-moe", "gemma-4", "llama-spm")}
    assert kinds == {
        "bert-bge": VocabType.WPM,
        "nomic-bert-moe": VocabType.UGM,
        "gemma-4": VocabType.BPE,
        "llama-spm": VocabType.SPM,
    }
    gemma = _tokenizer("gemma-4").vocab
    assert gemma.pre is not None and gemma.pre.pre_type == "GEMMA4" and not gemma.pre.byte_encode


def test_wordpiece_special_tokens():
    tok = _tokenizer("bert-bge")
    ids = tok.encode("Hello World!", add_special=True)
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]
    assert ids[1:-1] == tok.encode("hello world !", add_special=False)
    assert tok.encode("[MASK] x", parse_special=True, add_special=False)[0] == 103


def test_unigram_needs_its_normalization_map():
    with gguf_io.open(_path("nomic-bert-moe")) as f, pytest.raises(ValueError, match="from_file"):
        Tokenizer.from_gguf(f.tokenizer, f.header.name, f.header.architecture)


# ---- round trips on the files without pairs ----

ROUND_TRIP = [*ENGLISH, *CODE, *SCRIPTS, *EMOJI, "12345 678", "a  b\tc\n\nd"]


def _round_trips(name: str) -> list[str]:
    """What detokenize(tokenize(x)) keeps: SPM reads U+2581 as a space, "default" BPE cleans up spaces
    before punctuation, the unigram vocabulary normalizes its text (NFKC, single spaces)."""
    vocab = _tokenizer(name).vocab
    texts = [s for s in ROUND_TRIP if "\u2581" not in s]
    if vocab.clean_spaces:
        texts = [s for s in texts if not any(p in s for p in (" ?", " !", " .", " ,", " '"))]
    if vocab.type == VocabType.UGM:
        texts = [s for s in texts if s.isascii() and "  " not in s and "\t" not in s and "\n" not in s]
    return texts


@pytest.mark.parametrize("name", WITHOUT_PAIRS)
def test_round_trip(name):
    tok = _tokenizer(name)
    texts = _round_trips(name)
    assert len(texts) >= 8
    bad = [s for s in texts if tok.decode(tok.encode(s, add_special=False)) != s]
    assert not bad, f"{name}: {len(bad)}/{len(texts)} texts do not round-trip, first {bad[:3]}"


# ---- parity with llama.cpp ----


class _Reference:
    """A vocab-only llama.cpp model."""

    def __init__(self, lib, path: Path) -> None:
        self.lib = lib
        params = lib.llama_model_default_params()
        params.vocab_only = True
        self.model = lib.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, f"llama.cpp could not load {path}"
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = lib.llama_vocab_n_tokens(self.vocab)

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

    def close(self) -> None:
        self.lib.llama_model_free(self.model)


@pytest.fixture(scope="module")
def llama_lib():
    try:
        import llama_cpp
    except ImportError as e:  # selected parity tests must not pass silently
        pytest.fail(f"parity tests need llama-cpp-python (the llama.cpp reference): {e}")
    callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(lambda *_: None)
    llama_cpp.llama_log_set(callback, None)
    llama_cpp._vocab_test_log_callback = callback  # keep alive
    return llama_cpp


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return corpus()


MODES = [(True, False), (False, True)]  # (add_special, parse_special)


def _compare(ours: Tokenizer, ref: _Reference, texts: list[str], label: str) -> None:
    bad = []
    for add, parse in MODES:
        for s in texts:
            want = ref.tokenize(s, add, parse)
            got = ours.encode(s, add_special=add, parse_special=parse)
            if got != want:
                bad.append(f"add={add} parse={parse} {s!r}: ours {got} llama.cpp {want}")
    n = len(MODES) * len(texts)
    assert not bad, f"{label}: {n - len(bad)}/{n} match; first: " + "\n".join(bad[:5])
    for s in texts[::9]:
        ids = ref.tokenize(s, True, True)
        for remove in (False, True):
            assert ours.detokenize(ids, remove, True) == ref.detokenize(ids, remove, True), s
    assert ours.n_vocab == ref.n_vocab
    assert set(ours.eog_ids) == {t for t in range(ref.n_vocab) if ref.lib.llama_vocab_is_eog(ref.vocab, t)}


@pytest.mark.parity
@pytest.mark.parametrize("name", [*WITHOUT_PAIRS, "bert-bge"])
def test_matches_llama_cpp(name, llama_lib, texts):
    ref = _Reference(llama_lib, _path(name))
    try:
        _compare(_tokenizer(name), ref, texts, name)
    finally:
        ref.close()


def _rewrite(src: Path, dst: Path, overrides: dict[str, object], user_defined: tuple[str, ...] = ()) -> Path:
    """A copy of `src` with some keys replaced and the tokens `user_defined` made user-defined."""
    with gguf_io.open(src) as f:
        fields = list(f.fields.values())
        if user_defined:
            types = np.array(f.metadata["tokenizer.ggml.token_type"], np.int32)
            types[[f.tokenizer.tokens.index(t) for t in user_defined]] = 4
            overrides = {**overrides, "tokenizer.ggml.token_type": types}
    with GGUFWriter(str(dst)) as w:
        for field in fields:
            if field.name not in overrides:
                w.add_field(field)
        for key, value in overrides.items():
            w.add_metadata(key, value)
    return dst


# the normalizer flags the shipped files leave at their defaults
FLAG_VARIANTS: dict[str, tuple[str, dict[str, object], tuple[str, ...]]] = {
    "bert-cased": ("bert-bge", {"tokenizer.ggml.normalizer.lowercase": False}, ()),
    "bert-keep-accents": ("bert-bge", {"tokenizer.ggml.normalizer.strip_accents": False}, ()),
    "t5-spaces-kept": (
        "nomic-bert-moe",
        {"tokenizer.ggml.remove_extra_whitespaces": False, "tokenizer.ggml.add_space_prefix": False},
        (),
    ),
    # user-defined tokens score 0 and their prefixes skip the normalization map
    "t5-user-defined": ("nomic-bert-moe", {}, ("ing", "\u2581world", "\u108f\u103d\u1004\u1037\u1039")),
}
USER_DEFINED_TEXTS = [
    "singing in the rain",
    " world",
    "worl",
    "a world",
    "\u108f\u103d\u1004",
    "\u108f\u103d\u1004\u1037\u1039",
]


@pytest.mark.parity
@pytest.mark.parametrize("variant", list(FLAG_VARIANTS))
def test_normalizer_flags_match_llama_cpp(variant, llama_lib, texts, tmp_path):
    base, overrides, user_defined = FLAG_VARIANTS[variant]
    path = _rewrite(_path(base), tmp_path / "v.gguf", overrides, user_defined)
    with gguf_io.open(path) as f:
        ours = Tokenizer.from_file(f)
    ref = _Reference(llama_lib, path)
    try:
        _compare(ours, ref, texts[::2] + USER_DEFINED_TEXTS, variant)
    finally:
        ref.close()


# ---- an o200k-style vocabulary with the gpt-4o pre-tokenizer ----

# Merges are chains over these strings, so a token exists for every prefix of each; several cross the
# boundaries the gpt-4o regex draws (case changes, contractions, digit triples, newlines, scripts), so a
# wrong split shows as different ids.
_CASES = (" the", "The", " Hello", "Hello", "World", "HelloWorld", "helloWorld", "HELLOworld", "HTTPServer")
_CONTRACTIONS = ("'s", "'S", "'ll", "'re", "'ve", "'m", "'d", "n't", "don't", "DON'T", "I'm", "we'll")
_DIGITS_SPACES = (
    "123",
    "1234",
    "12345",
    "3.14",
    " 100",
    "1,000",
    "\n",
    "\n\n",
    "\r\n",
    "  ",
    "    ",
    "   \n",
)
_PUNCTUATION = (
    "\t",
    " (",
    "()",
    "):",
    " {\n",
    "//",
    " //",
    "/\n",
    " a/b",
    "a_b",
    "__init__",
    "foo.bar",
    "...",
)
_SCRIPTS = (
    "!!!",
    " ?!",
    "é",
    "café",
    " café",
    "Ünïcödé",
    "ÜBER",
    "日本",
    "日本語",
    "中文",
    "한국어",
    "😀",
    "🤖",
)
_MORE_SCRIPTS = (
    "привет",
    " Привет",
    "ПРИВЕТ",
    "ΑΒΓ",
    "αβγ",
    "x²",
    "½",
    "\u0301",
    "e\u0301",
    "ǅ",
    "ǅa",
    "http://",
)
_WORDS = _CASES + _CONTRACTIONS + _DIGITS_SPACES + _PUNCTUATION + _SCRIPTS + _MORE_SCRIPTS
_SPECIALS = ("<|endoftext|>", "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")


def write_o200k_style_vocab(path: Path) -> Path:
    """A vocab-only GGUF: GPT-2's 256 byte tokens, the chain merges of `_WORDS`, gpt-oss's special tokens."""
    tokens = [BYTE_ENCODER[b] for b in range(256)]
    known = set(tokens)
    merges: list[str] = []
    for word in _WORDS:
        chars = [BYTE_ENCODER[b] for b in word.encode("utf-8")]
        cur = chars[0]
        for ch in chars[1:]:
            if cur + ch not in known:
                merges.append(f"{cur} {ch}")
                tokens.append(cur + ch)
                known.add(cur + ch)
            cur += ch
    types = [1] * len(tokens) + [3] * len(_SPECIALS)
    tokens += _SPECIALS
    w = GGUFWriter(str(path))
    w.add_metadata("general.architecture", "llama")
    w.add_metadata("general.name", "o200k-style")
    for key, value in {
        "context_length": 128,
        "embedding_length": 64,
        "block_count": 1,
        "feed_forward_length": 128,
        "rope.dimension_count": 16,
        "attention.head_count": 4,
        "attention.head_count_kv": 4,
    }.items():
        w.add_metadata(f"llama.{key}", value, GGUFValueType.UINT32)
    w.add_metadata("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_metadata("tokenizer.ggml.model", "gpt2")
    w.add_metadata("tokenizer.ggml.pre", "gpt-4o")
    w.add_metadata("tokenizer.ggml.tokens", tokens)
    w.add_metadata("tokenizer.ggml.token_type", np.array(types, np.int32))
    w.add_metadata("tokenizer.ggml.merges", merges, GGUFValueType.ARRAY, GGUFValueType.STRING)
    eot = tokens.index("<|endoftext|>")
    w.add_metadata("tokenizer.ggml.bos_token_id", eot, GGUFValueType.UINT32)
    w.add_metadata("tokenizer.ggml.eos_token_id", tokens.index("<|return|>"), GGUFValueType.UINT32)
    w.finish()
    return path


def test_o200k_style_vocab_splits(tmp_path):
    with gguf_io.open(write_o200k_style_vocab(tmp_path / "o200k.gguf")) as f:
        tok = Tokenizer.from_file(f)
    pieces = [tok.token_text(t) for t in tok.encode("HelloWorld don't 12345", add_special=False)]
    # merges exist for "HelloWorld" and "12345": only the pre-tokenizer's splits keep them apart
    assert pieces == ["Hello", "World", "Ġ", "do", "n't", "Ġ", "123", "4", "5"]
    end = tok.token_id("<|end|>")
    assert end is not None and not tok.is_eog(end)  # gpt-oss: <|end|> ends a message, not generation


@pytest.mark.parity
def test_gpt4o_matches_llama_cpp(llama_lib, texts, tmp_path):
    path = write_o200k_style_vocab(tmp_path / "o200k.gguf")
    with gguf_io.open(path) as f:
        ours = Tokenizer.from_file(f)
    ref = _Reference(llama_lib, path)
    try:
        _compare(ours, ref, texts + [s * 3 for s in _WORDS], "gpt-4o")
    finally:
        ref.close()
