"""The tokenizer facade: text <-> token ids exactly as llama.cpp's `llama_tokenize` / `llama_detokenize`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from gguf_io import TokenizerData

from .bpe import BpeTokenizer
from .detok import PieceTable, StreamingDetokenizer, detokenize
from .special import SpecialSplitter
from .spm import SpmTokenizer
from .ugm import UgmTokenizer
from .vocab import TokenAttr, Vocab, VocabType
from .wpm import WpmTokenizer

if TYPE_CHECKING:
    from gguf_io import GGUFFile

__all__ = ["Tokenizer"]

_HIDDEN = int(TokenAttr.UNKNOWN | TokenAttr.CONTROL)
_Model = BpeTokenizer | SpmTokenizer | WpmTokenizer | UgmTokenizer
_MODELS: dict[VocabType, Callable[[Vocab], _Model]] = {
    VocabType.SPM: SpmTokenizer,
    VocabType.BPE: BpeTokenizer,
    VocabType.WPM: WpmTokenizer,
    VocabType.UGM: UgmTokenizer,
}


class Tokenizer:
    """A GGUF model's tokenizer (SentencePiece-style, GPT-2 byte-level BPE, WordPiece or unigram), built
    once, then read-only.

    >>> tok = Tokenizer.from_file(gguf_file)
    >>> ids = tok.encode("Hello world")          # BOS added when the model asks for it
    >>> tok.decode(ids, skip_special=True)
    'Hello world'
    """

    __slots__ = ("_model", "_pieces", "_splitter", "vocab")

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._splitter = SpecialSplitter(vocab)
        self._model = _MODELS[vocab.type](vocab)
        self._pieces = PieceTable(vocab)

    @classmethod
    def from_gguf(
        cls,
        tokenizer_data: TokenizerData,
        model_name: str | None = None,
        architecture: str | None = None,
        metadata: Mapping[str, object] | None = None,
    ) -> Tokenizer:
        """Build from `gguf_io.GGUFFile.tokenizer`. `model_name` (general.name) and `architecture` only matter
        for the few models llama.cpp special-cases by name (phi-3 strips spaces after special tokens);
        `metadata` (`GGUFFile.metadata`) gives the normalizer settings of BERT and T5 vocabularies."""
        return cls(Vocab.from_data(tokenizer_data, model_name, architecture, metadata))

    @classmethod
    def from_file(cls, gguf_file: GGUFFile) -> Tokenizer:
        """Build from an open GGUF file (a model or a vocabulary-only file), with everything llama.cpp reads."""
        return cls.from_gguf(
            gguf_file.tokenizer, gguf_file.header.name, gguf_file.header.architecture, gguf_file.metadata
        )

    def warmup(self) -> None:
        """Build the lazily built tables (unicode categories, the special-token regexes) now, not on the
        first request."""
        for parse in (False, True):
            self.encode("warm up \u00e9\u4f60 12 <s>", add_special=False, parse_special=parse)

    # ---- encoding ----

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize(vocab, text, add_special, parse_special).

        `add_special` adds BOS/EOS as the model's add_bos/add_eos say; `parse_special` lets special-token
        text in `text` (e.g. `<|im_start|>`) become that token; keep it False for user-supplied text.
        """
        v = self.vocab
        out: list[int] = []
        if add_special and (v.add_bos or v.type == VocabType.WPM):
            out.append(self._required(v.bos_id, "BOS"))
        frags = self._splitter.split(text, parse_special)
        if v.type == VocabType.SPM:
            spm = self._model
            prev_special = True
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                if v.add_space_prefix and prev_special:
                    frag = " " + frag
                spm.encode(frag.replace(" ", "\u2581"), out)
                prev_special = False
        elif v.type in (VocabType.WPM, VocabType.UGM):
            model = self._model
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    model.encode(frag, out)
        else:
            bpe = self._model
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    bpe.encode(frag.replace(" ", "\u2581") if v.escape_whitespaces else frag, out)
        if add_special and v.type == VocabType.WPM:
            out.append(self._required(v.sep_id, "SEP"))  # WordPiece wraps the text in [CLS] ... [SEP]
        elif add_special and v.add_eos:
            out.append(self._required(v.eos_id, "EOS"))
        return out

    @staticmethod
    def _required(tid: int | None, what: str) -> int:
        if tid is None:
            raise ValueError(f"the model asks for a {what} token but has none")
        return tid

    # ---- decoding ----

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """llama_token_to_piece(vocab, id, lstrip=0, special): the token's bytes; control and unknown tokens
        give b"" unless `special`."""
        self._check(token_id)
        if not special and self.vocab.attrs[token_id] & _HIDDEN:
            return b""
        return self._pieces[token_id]

    def detokenize(
        self, ids: Iterable[int], remove_special: bool = False, unparse_special: bool = False
    ) -> bytes:
        """llama_detokenize(vocab, ids, remove_special, unparse_special) as bytes."""
        ids = list(ids)
        for tid in ids:
            self._check(tid)
        return detokenize(self.vocab, self._pieces, ids, remove_special, unparse_special)

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids` (llama.cpp's common_detokenize with special = not skip_special); invalid UTF-8
        becomes U+FFFD."""
        return self.detokenize(ids, False, not skip_special).decode("utf-8", "replace")

    def streaming(self, special: bool = False) -> StreamingDetokenizer:
        """A detokenizer to feed generated ids one at a time."""
        return StreamingDetokenizer(self, special)

    def _check(self, tid: int) -> None:
        if not 0 <= tid < len(self._pieces):
            raise ValueError(f"token id {tid} is outside the vocabulary of {len(self._pieces)} tokens")

    # ---- vocabulary facts ----

    @property
    def n_vocab(self) -> int:
        return len(self.vocab.tokens)

    @property
    def bos_id(self) -> int | None:
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        return self.vocab.eos_id

    @property
    def eot_id(self) -> int | None:
        return self.vocab.eot_id

    @property
    def eog_ids(self) -> frozenset[int]:
        """Every id that ends generation (llama_vocab_is_eog)."""
        return self.vocab.eog_ids

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self.vocab.add_eos

    @property
    def fim_ids(self) -> dict[str, int | None]:
        """FIM token ids: pre, suf, mid, pad, rep, sep (None when the model has none)."""
        v = self.vocab
        return {
            "pre": v.fim_pre_id,
            "suf": v.fim_suf_id,
            "mid": v.fim_mid_id,
            "pad": v.fim_pad_id,
            "rep": v.fim_rep_id,
            "sep": v.fim_sep_id,
        }

    def is_eog(self, token_id: int) -> bool:
        """True for end-of-generation tokens (eos, eot, eom and the end-of-turn texts llama.cpp knows)."""
        return token_id in self.vocab.eog_ids

    def is_control(self, token_id: int) -> bool:
        self._check(token_id)
        return bool(self.vocab.attrs[token_id] & TokenAttr.CONTROL)

    def token_text(self, token_id: int) -> str:
        """The token's text as stored in the vocabulary (llama_vocab_get_text)."""
        self._check(token_id)
        return self.vocab.tokens[token_id]

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary text is `text`, if any."""
        return self.vocab.text_to_id.get(text)

    def token_attr(self, token_id: int) -> TokenAttr:
        self._check(token_id)
        return TokenAttr(self.vocab.attrs[token_id])

    def pieces(self, ids: Sequence[int], special: bool = False) -> list[bytes]:
        """token_to_piece for each id."""
        return [self.token_to_piece(t, special) for t in ids]
