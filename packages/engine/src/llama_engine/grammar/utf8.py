"""UTF-8 as the grammar sees token pieces: llama.cpp's ``decode_utf8`` with a partial sequence carried
from one token to the next, and the test of a partial sequence against a char class.

Decoding follows llama.cpp byte for byte (a C string: a NUL byte ends the piece; continuation bytes of
a started sequence are not checked; a lead byte that cannot start a sequence makes the piece invalid).
"""

from __future__ import annotations

__all__ = ["INVALID", "NO_PARTIAL", "Partial", "decode_utf8", "partial_range"]

Partial = tuple[int, int]  # (bits so far, bytes remaining); remaining -1: invalid sequence
NO_PARTIAL: Partial = (0, 0)
INVALID: Partial = (0, -1)
_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4)  # sequence length by the lead byte's high nibble


def decode_utf8(piece: bytes, partial: Partial = NO_PARTIAL) -> tuple[list[int], Partial]:
    """(complete code points, the partial sequence left at the end) of ``piece`` after ``partial``.

    An invalid piece gives no code points and ``INVALID`` (the grammar rejects it)."""
    nul = piece.find(0)
    if nul >= 0:
        piece = piece[:nul]
    if partial == NO_PARTIAL:
        try:
            text = piece.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:  # well-formed: what llama.cpp's decoder gives too
            return [ord(c) for c in text], NO_PARTIAL
    return _decode_slow(piece, partial)


def _decode_slow(piece: bytes, partial: Partial) -> tuple[list[int], Partial]:
    out: list[int] = []
    value, n_remain = partial
    pos, n = 0, len(piece)
    while pos < n and n_remain > 0:
        b = piece[pos]
        if b >> 6 != 2:
            return [], INVALID
        value = (value << 6) + (b & 0x3F)
        pos += 1
        n_remain -= 1
    if partial[1] > 0 and n_remain == 0:
        out.append(value)
    while pos < n:
        b = piece[pos]
        n_remain = _LEN[b >> 4] - 1
        if n_remain < 0:
            return [], INVALID
        value = b & ((1 << (7 - n_remain)) - 1)
        pos += 1
        while pos < n and n_remain > 0:
            value = (value << 6) + (piece[pos] & 0x3F)
            pos += 1
            n_remain -= 1
        if n_remain == 0:
            out.append(value)
    if out and 0 in out:  # a decoded NUL ends the code points, as llama.cpp's 0-terminated array
        out = out[: out.index(0)]
    return out, ((value, n_remain) if n_remain != 0 else NO_PARTIAL)


def partial_range(partial: Partial) -> tuple[int, int] | None:
    """The code points a partial sequence can still complete to, or None if it can complete to none
    (invalid, or an overlong 2-byte form), as llama_grammar_match_partial_char."""
    value, n_remain = partial
    if n_remain < 0 or (n_remain == 1 and value < 2):
        return None
    low = value << (n_remain * 6)
    high = low | ((1 << (n_remain * 6)) - 1)
    if low == 0:
        if n_remain == 2:
            low = 1 << 11
        elif n_remain == 3:
            low = 1 << 16
    return low, high
