"""Response header names in canonical case (`Access-Control-Allow-Origin`, `Content-Type`), as llama-server
sends them, for `llama-server` (on h11) and `llama-router` (on httptools).

HTTP says header names are case-insensitive, but clients that copy headers into a plain dictionary (Python's
`dict(response.headers)`, as llama.cpp's own tests do; JavaScript objects) look them up case-sensitively,
and Litestar and the edges write them in lower case. `canonical_name` spells a name once (a dictionary
lookup per header, filled on first sight of a name).

h11 writes a header name as it is given. uvicorn's httptools protocol lower-cases every name it writes
(`name = name.lower()`, then compares it with `b"content-length"` and the like). `wire_name` gives a
`CanonicalName` instead: bytes in canonical case whose `lower()` is itself and that compare and hash as their
lower-case form, so the protocol's checks see `content-length` while the canonical spelling goes out. A
protocol that lower-cases some other way just writes lower case again.
"""

from __future__ import annotations

__all__ = ["CanonicalName", "canonical_name", "wire_name"]

# names whose usual spelling is not plain Title-Case of their dash-separated words
_SPECIAL = {
    b"www-authenticate": b"WWW-Authenticate",
    b"etag": b"ETag",
    b"te": b"TE",
    b"content-md5": b"Content-MD5",
    b"x-xss-protection": b"X-XSS-Protection",
}
_MAX_CACHED = 1024  # names an app can send are few; a bound keeps odd ones from growing the tables


def _title(name: bytes) -> bytes:
    return b"-".join(part[:1].upper() + part[1:].lower() for part in name.split(b"-"))


_cache: dict[bytes, bytes] = dict(_SPECIAL)


def canonical_name(name: bytes) -> bytes:
    """`content-type` -> `Content-Type`; a name already spelled some other way is also normalised."""
    out = _cache.get(name)
    if out is None:
        lower = name.lower()
        out = _SPECIAL.get(lower) or _title(lower)
        if len(_cache) < _MAX_CACHED:
            _cache[name] = out
    return out


class CanonicalName(bytes):
    """A header name in canonical case that a server protocol's `name.lower()` leaves as it is; equal to,
    and hashed as, its lower-case form (so `name == b"content-length"` still holds)."""

    __slots__ = ()

    def lower(self) -> CanonicalName:  # type: ignore[override]
        return self

    def __eq__(self, other: object) -> bool:
        if isinstance(other, bytes):
            return bytes.lower(self) == bytes.lower(other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(bytes.lower(self))


_wire: dict[bytes, CanonicalName] = {}


def wire_name(name: bytes) -> CanonicalName:
    """`name` as a CanonicalName (one object per name, made on first sight)."""
    out = _wire.get(name)
    if out is None:
        out = CanonicalName(canonical_name(name))
        if len(_wire) < _MAX_CACHED:
            _wire[name] = out
    return out
