"""Ids back to text: token pieces (llama.cpp's `llama_token_to_piece`), whole-sequence detokenizing
(`llama_detokenize`, with its clean-up of spaces) and a streaming detokenizer for generated tokens.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .bpe import BYTE_DECODER
from .vocab import TokenAttr, Vocab, VocabType

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

__all__ = ["PieceTable", "StreamingDetokenizer", "clean_spaces", "detokenize"]

_RAW = int(TokenAttr.UNKNOWN | TokenAttr.CONTROL | TokenAttr.USER_DEFINED)
_NORMAL = int(TokenAttr.NORMAL)
_BYTE = int(TokenAttr.BYTE)
# GPT-2 alphabet -> latin-1 byte; every other code point below 256 maps past latin-1 so encoding fails
_GPT2_TABLE = {cp: "\uffff" for cp in range(256)} | {ord(c): chr(b) for c, b in BYTE_DECODER.items()}


def _decode_text(text: str) -> bytes:
    """llama_decode_text: GPT-2 alphabet back to bytes (unknown characters leave a marker, as llama.cpp)."""
    try:
        return text.translate(_GPT2_TABLE).encode("latin-1")
    except UnicodeEncodeError:
        pass
    out = bytearray()
    raw = text.encode("utf-8", "surrogatepass")
    for ch in text:
        b = BYTE_DECODER.get(ch)
        if b is not None:
            out.append(b)
        else:
            hexed = "".join(f"{x:02x}" for x in ch.encode("utf-8", "surrogatepass")).encode()
            out += b"[UNK_BYTE_0x" + hexed + raw + b"]"
    return bytes(out)


def _byte_value(text: str) -> int:
    # token_to_byte: strtol(text.substr(3, 2), 16), stopping at the first non-hex character
    digits = ""
    for ch in text[3:5]:
        if ch not in "0123456789abcdefABCDEF":
            break
        digits += ch
    return int(digits, 16) if digits else 0


def _piece(text: str, attr: int, unescape: bool) -> bytes:
    if attr & _RAW:
        return text.encode("utf-8", "surrogatepass")
    if attr & _NORMAL:
        if unescape:
            return text.replace("\u2581", " ").encode("utf-8", "surrogatepass")
        return _decode_text(text)
    if attr & _BYTE:
        return bytes([_byte_value(text)])
    return b""


class PieceTable:
    """Every token's piece as llama.cpp's cache_token_to_piece (rendered with special=True), computed on
    first use so that loading a 262k vocabulary stays cheap."""

    __slots__ = ("_attrs", "_pieces", "_texts", "_unescape")

    def __init__(self, vocab: Vocab) -> None:
        self._texts = vocab.tokens
        self._attrs = vocab.attrs
        self._unescape = vocab.type == VocabType.SPM or vocab.escape_whitespaces
        self._pieces: list[bytes | None] = [None] * len(vocab.tokens)

    def __len__(self) -> int:
        return len(self._pieces)

    def __getitem__(self, tid: int) -> bytes:
        piece = self._pieces[tid]
        if piece is None:
            piece = self._pieces[tid] = _piece(self._texts[tid], self._attrs[tid], self._unescape)
        return piece


def clean_spaces(text: bytes) -> bytes:
    """The three clean-up passes of llama_detokenize (clean_up_tokenization_spaces), byte for byte."""
    t = bytearray(text)
    # " ?", " !", " .", " ,": drop the space
    total = 1 if t else 0
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    del t[total:]
    # " ' ": drop both spaces
    n = len(t)
    total = 1 if t else 0
    i = 1
    while i < n:
        x = t[i]
        if x == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    del t[total:]
    # " 's", " 'm", " 're", " 've": drop the space
    n = len(t)
    total = 1 if t else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm" or (x1 in b"rv" and i + 2 < n and t[i + 2] == 0x65):
                total -= 1
        t[total] = x
        total += 1
    del t[total:]
    return bytes(t)


def detokenize(
    vocab: Vocab, pieces: PieceTable, ids: Iterable[int], remove_special: bool, unparse_special: bool
) -> bytes:
    """llama_detokenize(vocab, ids, remove_special, unparse_special) as bytes."""
    ids = list(ids)
    remove_space = vocab.add_space_prefix
    if remove_special and vocab.add_bos and ids and ids[0] == vocab.bos_id:
        remove_space = False
        ids = ids[1:]
    if remove_special and vocab.add_eos and ids and ids[-1] == vocab.eos_id:
        ids = ids[:-1]
    attrs = vocab.attrs
    hidden = int(TokenAttr.UNKNOWN | TokenAttr.CONTROL)
    parts = []
    for tid in ids:
        piece = b"" if not unparse_special and attrs[tid] & hidden else pieces[tid]
        if remove_space:
            if piece[:1] == b" ":
                piece = piece[1:]
            remove_space = False
        parts.append(piece)
    out = b"".join(parts)
    return clean_spaces(out) if vocab.clean_spaces else out


class StreamingDetokenizer:
    """Turns generated ids into text one at a time, holding back an incomplete UTF-8 sequence until the
    token that completes it arrives (invalid bytes become U+FFFD).

    Pieces are concatenated as llama-server does for generated text (`llama_token_to_piece`, no space
    stripping or clean-up); `special` renders control tokens' text.
    """

    __slots__ = ("_decoder", "_tokenizer", "special")

    def __init__(self, tokenizer: Tokenizer, special: bool = False) -> None:
        self._tokenizer = tokenizer
        self.special = special
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, token_id: int, special: bool | None = None) -> str:
        """The text completed by this token (possibly empty); ``special`` overrides the stream's setting
        for this token (a preserved special token's text is output)."""
        render = self.special if special is None else special
        return self._decoder.decode(self._tokenizer.token_to_piece(token_id, render))

    def flush(self) -> str:
        """Whatever is held back, with an unfinished sequence as U+FFFD; the stream can then be reused."""
        out = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return out

    @property
    def pending(self) -> bytes:
        """The bytes held back so far."""
        return self._decoder.getstate()[0]
