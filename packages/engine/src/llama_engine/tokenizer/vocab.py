"""The vocabulary as llama.cpp sees it after `llama_vocab::impl::load`: token attributes, special ids,
defaults per tokenizer model, the end-of-generation set and the special-token search order.

Everything here is computed once from `gguf_io.TokenizerData` and then only read.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum, IntFlag

import numpy as np

from gguf_io import TokenizerData

from .pretokenize import PreTokenizerConfig, pre_tokenizer_config

__all__ = ["TokenAttr", "Vocab", "VocabType"]


class VocabType(IntEnum):
    """llama_vocab_type (only the kinds implemented here)."""

    SPM = 1  # SentencePiece-style, `tokenizer.ggml.model` = "llama"
    BPE = 2  # GPT-2 byte-level BPE, "gpt2" (and "gemma4": BPE on raw UTF-8)
    WPM = 3  # WordPiece, "bert"
    UGM = 4  # SentencePiece unigram, "t5"


class TokenAttr(IntFlag):
    """llama_token_attr bits."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# llama_token_type (GGUF tokenizer.ggml.token_type) -> attribute
_TYPE_TO_ATTR = {
    0: TokenAttr.UNDEFINED,
    1: TokenAttr.NORMAL,
    2: TokenAttr.UNKNOWN,
    3: TokenAttr.CONTROL,
    4: TokenAttr.USER_DEFINED,
    5: TokenAttr.UNUSED,
    6: TokenAttr.BYTE,
}
_CONTROL = int(TokenAttr.CONTROL)
_UNUSED = int(TokenAttr.UNUSED)
_SPECIAL_ATTRS = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)

# Token texts llama.cpp recognises when the file does not name the token (in its order of checks).
_AUTO = {
    "eot_id": (
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "<｜end▁of▁sentence｜>",
        "<end_of_utterance>",
    ),
    "eom_id": ("<|eom_id|>",),
    "fim_pre_id": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "fim_suf_id": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "fim_mid_id": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "fim_pad_id": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep_id": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep_id": ("<|file_sep|>",),
}
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<｜end▁of▁sentence｜>",
        "[e~[",
    }
)
_ALWAYS_RENDERED = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})  # gpt-oss


@dataclass(frozen=True, slots=True)
class Vocab:
    """A loaded vocabulary; ids are None where llama.cpp has LLAMA_TOKEN_NULL."""

    type: VocabType
    pre: PreTokenizerConfig | None  # BPE only
    tokens: tuple[str, ...]
    text_to_id: dict[str, int]
    scores: Sequence[float]  # an array of float32 (a 262k vocabulary: 1 MiB, not 8 as Python floats)
    attrs: tuple[int, ...]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    eom_id: int | None
    unk_id: int | None
    sep_id: int | None
    pad_id: int | None
    mask_id: int | None
    fim_pre_id: int | None
    fim_suf_id: int | None
    fim_mid_id: int | None
    fim_pad_id: int | None
    fim_rep_id: int | None
    fim_sep_id: int | None
    add_bos: bool
    add_eos: bool
    add_sep: bool
    add_space_prefix: bool
    escape_whitespaces: bool
    clean_spaces: bool
    ignore_merges: bool
    eog_ids: frozenset[int]
    special_order: tuple[int, ...]  # cache_special_tokens: control/user-defined/unknown, longest text first
    merges: dict[tuple[str, str], int]  # bpe_ranks
    remove_extra_whitespaces: bool  # UGM: runs of spaces become one
    lowercase: bool  # WPM (BertNormalizer): lowercase each codepoint
    strip_accents: bool  # WPM: decompose and drop accent marks
    charsmap: bytes  # UGM: SentencePiece's precompiled normalization map (empty: none)
    # UGM: the attributes as the file gives them; llama.cpp builds its token trie from these, before it marks
    # end-of-generation texts as control tokens
    matcher_attrs: tuple[int, ...] | None

    @classmethod
    def from_data(
        cls,
        data: TokenizerData,
        model_name: str | None = None,
        architecture: str | None = None,
        metadata: Mapping[str, object] | None = None,
    ) -> Vocab:
        """Build as llama_vocab::impl::load does; `model_name` (general.name) and `architecture` only
        select llama.cpp's per-model strip attributes (phi-3, jina, modern-bert). `metadata` (the file's
        key/value mapping) supplies the normalizer keys `TokenizerData` does not carry: BERT's
        `tokenizer.ggml.normalizer.*` and T5's `tokenizer.ggml.precompiled_charsmap`, which a "t5"
        vocabulary requires."""
        b = _Builder(data, metadata)
        b.attributes_by_name(model_name or "", architecture or "", data.pre or "")
        return b.finish(cls)


class _Builder:
    """The steps of llama_vocab::impl::load, kept as mutable state until `finish`."""

    def __init__(self, data: TokenizerData, metadata: Mapping[str, object] | None) -> None:
        model = data.model
        self.pre: PreTokenizerConfig | None = None
        ids: dict[str, int | None] = dict.fromkeys(
            ("bos_id", "eos_id", "eot_id", "eom_id", "unk_id", "sep_id", "pad_id", "mask_id")
        )
        ids.update(
            dict.fromkeys(
                ("fim_pre_id", "fim_suf_id", "fim_mid_id", "fim_pad_id", "fim_rep_id", "fim_sep_id")
            )
        )
        self.add_bos = self.add_eos = self.add_sep = False
        self.add_space_prefix = False
        self.escape_whitespaces = True
        self.clean_spaces = False
        self.ignore_merges = False
        if model == "llama":
            self.type = VocabType.SPM
            ids.update(bos_id=1, eos_id=2, unk_id=0)
            self.add_space_prefix = True
            self.add_bos = True
        elif model in ("gpt2", "gemma4"):
            self.type = VocabType.BPE
            if model == "gpt2":
                ids.update(bos_id=11, eos_id=11)
            pre = pre_tokenizer_config("gemma4" if model == "gemma4" else data.pre)
            self.pre = pre
            self.escape_whitespaces = pre.escape_whitespaces
            self.clean_spaces = pre.clean_spaces
            self.ignore_merges = pre.ignore_merges
            if pre.add_bos is not None:
                self.add_bos = pre.add_bos
            if pre.add_sep is not None:
                self.add_sep = pre.add_sep
            if pre.bos_null:
                ids["bos_id"] = None
        elif model == "bert":
            self.type = VocabType.WPM
            ids.update(bos_id=101, unk_id=100, sep_id=102, pad_id=0, mask_id=103)
            self.add_bos = self.add_sep = True
            self.clean_spaces = True
        elif model == "t5":
            self.type = VocabType.UGM
            ids.update(eos_id=1, unk_id=2, pad_id=0)
            self.add_eos = True
            if metadata is None:
                raise ValueError(
                    "a T5 (unigram) vocabulary needs the file's metadata for its normalization map: "
                    "build it with Tokenizer.from_file"
                )
        elif model in ("rwkv", "plamo2", "hybriddna", "whitespace"):
            raise NotImplementedError(f"tokenizer model {model!r} is not supported yet")
        else:
            raise ValueError(f"unknown tokenizer: {model!r}")
        if data.add_space_prefix is not None:
            self.add_space_prefix = data.add_space_prefix
        self.remove_extra_whitespaces = bool(data.remove_extra_whitespaces)
        meta = metadata or {}
        self.lowercase = _flag(meta, "tokenizer.ggml.normalizer.lowercase", True)
        self.strip_accents = _flag(meta, "tokenizer.ggml.normalizer.strip_accents", self.lowercase)
        self.charsmap = _charsmap(meta) if self.type == VocabType.UGM else b""

        tokens = tuple(t if t else f"[EMPTY_{i}]" for i, t in enumerate(data.tokens))
        n = len(tokens)
        self.tokens = tokens
        self.text_to_id = dict(zip(tokens, range(n), strict=True))
        if len(self.text_to_id) != n:
            raise ValueError("the vocabulary has duplicate token texts")
        scores = np.zeros(n, np.float32) if data.scores is None else np.asarray(data.scores, np.float32)
        self.scores = array("f", scores.tobytes())
        if data.token_types is not None:
            # types outside 0..6 are UNDEFINED, as in llama.cpp
            table = np.array([int(_TYPE_TO_ATTR[t]) for t in range(7)] + [0], dtype=np.int64)
            types = data.token_types.astype(np.int64)
            types[(types < 0) | (types > 6)] = 7
            self.attrs = table[types].tolist()
        else:
            self.attrs = [int(TokenAttr.NORMAL)] * n
        self.matcher_attrs = tuple(self.attrs) if self.type == VocabType.UGM else None

        # defaults out of range are disabled; ids from the file (validated by gguf-io) replace them
        for key, default in ids.items():
            if default is not None and default >= n:
                ids[key] = None
            given = getattr(data, key)
            if given is not None:
                ids[key] = given
        self.ids = ids
        if data.add_bos is not None:
            self.add_bos = data.add_bos
        if data.add_eos is not None:
            self.add_eos = data.add_eos
        if data.add_sep is not None:
            self.add_sep = data.add_sep
        if self.pre is not None and self.pre.pre_type == "GEMMA4" and not self.add_bos:
            self.add_bos = True  # llama.cpp's workaround for Gemma 4

        self.merges: dict[tuple[str, str], int] = {}
        if self.type == VocabType.BPE:
            if data.merges is None:
                raise ValueError("cannot find tokenizer merges in model file")
            merges = self.merges
            for rank, word in enumerate(data.merges):
                pos = word.find(" ", 1)
                pair = (word[:pos], word[pos + 1 :]) if pos != -1 else ("", "")
                merges.setdefault(pair, rank)  # unordered_map::emplace keeps the first
        self._detect_special()
        self._build_eog()

    def _mark_control(self, tid: int) -> None:
        self.attrs[tid] |= _CONTROL

    def _detect_special(self) -> None:
        # llama.cpp walks its unordered_map; we take the lowest id among the candidates.
        ids, t2i = self.ids, self.text_to_id
        for key, texts in _AUTO.items():
            if ids[key] is None:
                found = [t2i[t] for t in texts if t in t2i]
                if found:
                    ids[key] = min(found)
                    self._mark_control(min(found))
        attrs = self.attrs
        for tid, text in enumerate(self.tokens):
            if attrs[tid] & _CONTROL and "unused" in text:
                attrs[tid] |= _UNUSED

    def _build_eog(self) -> None:
        ids, attrs, tokens = self.ids, self.attrs, self.tokens
        eog: set[int] = set()
        for key in ("fim_pad_id", "fim_rep_id", "fim_sep_id"):
            if (tid := ids[key]) is not None:
                eog.add(tid)
        for text in _EOG_TEXTS:
            if (tid := self.text_to_id.get(text)) is not None:
                eog.add(tid)
                self._mark_control(tid)
        for text in _ALWAYS_RENDERED:
            if (tid := self.text_to_id.get(text)) is not None:
                attrs[tid] = int(TokenAttr.USER_DEFINED)
        for key in ("eos_id", "eot_id", "eom_id"):
            if (tid := ids[key]) is not None:
                eog.add(tid)
        texts = {tokens[t]: t for t in sorted(eog)}
        has_call = "<|call|>" in texts or "<|calls|>" in texts
        end_id = texts.get("<|end|>")
        if end_id is not None and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
            eog.discard(end_id)  # o200k_harmony / solar-open: <|end|> is not end of generation
            attrs[end_id] = int(TokenAttr.USER_DEFINED)
        s_id = texts.get("</s>")
        if s_id is not None and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            eog.discard(s_id)  # gemma4 and plamo have a normal </s>
            attrs[s_id] = int(TokenAttr.NORMAL)
        self.eog = frozenset(eog)

    def attributes_by_name(self, model_name: str, arch: str, pre: str) -> None:
        """The per-model LSTRIP/RSTRIP attributes of llama.cpp (set after the piece cache is built)."""
        attrs, t2i = self.attrs, self.text_to_id
        name = model_name.lower()

        def set_attr(text: str, attr: TokenAttr, value: bool) -> None:
            tid = t2i.get(text)
            if tid is not None:
                attrs[tid] = attrs[tid] | int(attr) if value else attrs[tid] & ~int(attr)

        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
        ):
            set_attr("<mask>", TokenAttr.LSTRIP, True)
        elif "phi-3" in name or "phi3" in name:
            for tid in self._special_order():
                attrs[tid] |= int(TokenAttr.RSTRIP)
            set_attr("</s>", TokenAttr.RSTRIP, True)
            for text in ("<unk>", "<s>", "<|endoftext|>"):
                set_attr(text, TokenAttr.RSTRIP, False)
        elif "modern-bert" in name:
            set_attr("[MASK]", TokenAttr.LSTRIP, True)

    def _special_order(self) -> list[int]:
        special = [i for i, a in enumerate(self.attrs) if a & _SPECIAL_ATTRS]
        # std::sort by byte length, longest first; equal lengths keep id order here (std::sort is unstable)
        special.sort(key=lambda i: -len(self.tokens[i].encode("utf-8", "surrogatepass")))
        return special

    def finish(self, cls: type[Vocab]) -> Vocab:
        return cls(
            type=self.type,
            pre=self.pre,
            tokens=self.tokens,
            text_to_id=self.text_to_id,
            scores=self.scores,
            attrs=tuple(self.attrs),
            **self.ids,  # type: ignore[arg-type]
            add_bos=self.add_bos,
            add_eos=self.add_eos,
            add_sep=self.add_sep,
            add_space_prefix=self.add_space_prefix,
            escape_whitespaces=self.escape_whitespaces,
            clean_spaces=self.clean_spaces,
            ignore_merges=self.ignore_merges,
            eog_ids=self.eog,
            special_order=tuple(self._special_order()),
            merges=self.merges,
            remove_extra_whitespaces=self.remove_extra_whitespaces,
            lowercase=self.lowercase,
            strip_accents=self.strip_accents,
            charsmap=self.charsmap,
            matcher_attrs=self.matcher_attrs,
        )


def _flag(meta: Mapping[str, object], key: str, default: bool) -> bool:
    value = meta.get(key, default)
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{key} must be a boolean, not {type(value).__name__}")
    return bool(value)


def _charsmap(meta: Mapping[str, object]) -> bytes:
    """tokenizer.ggml.precompiled_charsmap as bytes (stored as an int8 or uint8 array)."""
    key = "tokenizer.ggml.precompiled_charsmap"
    value = meta.get(key)
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    try:
        arr = np.asarray(value)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise TypeError
        return arr.astype(np.int64).astype(np.uint8).tobytes()
    except (TypeError, ValueError) as e:
        raise ValueError(f"{key} must be an array of bytes") from e
