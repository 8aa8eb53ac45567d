"""What llama-quantize changes besides tensor types: metadata overrides and pruned layers.

``--override-kv KEY=TYPE:VALUE`` is parsed as common.cpp's ``string_parse_kv_override`` does (``int:`` by
``atol``, ``float:`` by ``atof``, ``bool:true|false``, ``str:`` up to 127 bytes) and written as
``llama_model_quantize_impl`` writes it: ints as uint32 of the absolute value, floats as float32, each
override removing the key and appending it at the end. ``--prune-layers`` follows ``parse_layer_prune``
and ``remap_layer``: the listed blocks go, the later ones are renumbered, ``{arch}.block_count`` is set.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gguf_io import GGUFValueType

__all__ = [
    "KVOverride",
    "OverrideTag",
    "apply_to_metadata",
    "override_field",
    "parse_kv_override",
    "parse_prune_layers",
    "remap_layers",
]


class OverrideTag(enum.IntEnum):
    """llama_model_kv_override_type."""

    INT = 0
    FLOAT = 1
    BOOL = 2
    STR = 3


@dataclass(frozen=True, slots=True)
class KVOverride:
    """One metadata override: the key, its tag and the parsed value (int, float, bool or str)."""

    key: str
    tag: OverrideTag
    value: int | float | bool | str


_ATOL = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_ATOF = re.compile(
    r"[ \t\n\v\f\r]*([+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?"
    r"|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan))",
    re.IGNORECASE,
)


def _atol(s: str) -> int:
    """C's ``atol`` (strtol saturating at the int64 range; 0 when nothing parses)."""
    m = _ATOL.match(s)
    if m is None:
        return 0
    return max(-(1 << 63), min((1 << 63) - 1, int(m.group(1))))


def _atof(s: str) -> float:
    """C's ``atof``: the longest prefix strtod accepts, 0.0 when none."""
    m = _ATOF.match(s)
    if m is None:
        return 0.0
    text = m.group(1)
    body = text.lstrip("+-")
    if body[:2].lower() == "0x":
        v = float.fromhex(body if "p" in body.lower() else body + "p0")
        return -v if text.startswith("-") else v
    return float(text)


def parse_kv_override(spec: str) -> KVOverride:
    """``KEY=int:N``, ``KEY=float:F``, ``KEY=bool:true|false`` or ``KEY=str:S``; ValueError otherwise."""
    key, sep, rest = spec.partition("=")
    if not sep or not key or len(key.encode("utf-8", "surrogateescape")) >= 128:
        raise ValueError(f"malformed KV override {spec!r}")
    if rest.startswith("int:"):
        return KVOverride(key, OverrideTag.INT, _atol(rest[4:]))
    if rest.startswith("float:"):
        return KVOverride(key, OverrideTag.FLOAT, _atof(rest[6:]))
    if rest.startswith("bool:"):
        if rest[5:] not in ("true", "false"):
            raise ValueError(f"invalid boolean value for KV override {spec!r}")
        return KVOverride(key, OverrideTag.BOOL, rest[5:] == "true")
    if rest.startswith("str:"):
        if len(rest[4:].encode("utf-8", "surrogateescape")) > 127:
            raise ValueError(f"malformed KV override {spec!r}, value cannot exceed 127 chars")
        return KVOverride(key, OverrideTag.STR, rest[4:])
    raise ValueError(f"invalid type for KV override {spec!r}")


def override_field(o: KVOverride) -> tuple[GGUFValueType, Any]:
    """The (type, value) llama_model_quantize_impl writes for an override (gguf_set_val_*)."""
    if o.tag == OverrideTag.INT:
        # gguf_set_val_u32(key, (uint32_t) std::abs(val_i64))
        return GGUFValueType.UINT32, abs(int(o.value)) & 0xFFFFFFFF
    if o.tag == OverrideTag.FLOAT:
        with np.errstate(over="ignore"):
            return GGUFValueType.FLOAT32, float(np.float32(o.value))
    if o.tag == OverrideTag.BOOL:
        return GGUFValueType.BOOL, bool(o.value)
    return GGUFValueType.STRING, str(o.value)


def apply_to_metadata(md: dict[str, Any], overrides: Iterable[KVOverride]) -> dict[str, Any]:
    """The metadata the model loader sees: an override replaces a key when its tag fits the key's type.

    (llama_model_loader's ``get_key`` uses an override of the matching kind, or of a missing key, and
    warns and keeps the file's value otherwise.) Used for the hyperparameters the mixture rules read.
    """
    out = dict(md)
    for o in overrides:
        have = md.get(o.key)
        fits = {
            OverrideTag.INT: isinstance(have, int) and not isinstance(have, bool),
            OverrideTag.FLOAT: isinstance(have, float),
            OverrideTag.BOOL: isinstance(have, bool),
            OverrideTag.STR: isinstance(have, str),
        }[o.tag]
        if have is None or fits:
            out[o.key] = o.value
    return out


def parse_prune_layers(spec: str) -> tuple[int, ...]:
    """``L0,L1,...`` sorted and deduplicated; ValueError for an id that is not a non-negative integer."""
    ids = []
    for part in spec.split(","):
        m = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", part)  # std::stoi: leading digits, rest ignored
        i = int(m.group(1)) if m is not None and abs(int(m.group(1))) < (1 << 31) else -1
        if i < 0:
            raise ValueError(f"invalid layer id {part!r}")
        ids.append(i)
    return tuple(sorted(set(ids)))


_BLK = re.compile(r"blk\.(\d+)\.")


def remap_layers(names: Sequence[str], prune: Sequence[int]) -> tuple[dict[str, str], int]:
    """New name of every kept tensor (in ``names``' order, weight order) and the new block count.

    llama.cpp's ``remap_layer``: blocks before the first pruned one keep their number, later kept blocks
    are numbered on from there; tensors of pruned blocks are left out of the mapping.
    """
    if not prune:
        return {n: n for n in names}, -1
    pruned = set(prune)
    mapped: dict[int, str] = {}
    next_id = 0
    out: dict[str, str] = {}
    for name in names:
        m = _BLK.search(name)
        if m is None:
            out[name] = name
            continue
        blk = int(m.group(1))
        if blk not in mapped:
            if blk in pruned:
                mapped[blk] = ""
            elif blk < prune[0]:
                mapped[blk] = str(blk)
                next_id = blk + 1
            else:
                mapped[blk] = str(next_id)
                next_id += 1
        if mapped[blk]:
            out[name] = name[: m.start(1)] + mapped[blk] + name[m.end(1) :]
    return out, next_id
