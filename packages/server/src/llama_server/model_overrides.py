"""`--override-kv KEY=TYPE:VALUE` and `--rope-freq-base`: model metadata changed before the engine is built.

The GGUF file is opened here and its parsed header (the hyperparameters the engine reads) and metadata
are replaced in the opened file object, which is then handed to the engine: the file on disk is never
written.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gguf_io import GGUFFile
from gguf_io import open as open_gguf

__all__ = ["open_with_overrides", "parse_override_kv"]

_TYPES = {"int": int, "float": float, "bool": None, "str": str}
# metadata key (after "<arch>.") -> the ModelHeader field it sets
_HEADER_KEYS = {
    "context_length": "context_length",
    "rope.freq_base": "rope_freq_base",
    "rope.freq_base_swa": "rope_freq_base_swa",
    "rope.dimension_count": "rope_dimension_count",
    "rope.scaling.type": "rope_scaling_type",
    "rope.scaling.factor": "rope_scaling_factor",
    "attention.layer_norm_rms_epsilon": "layer_norm_rms_epsilon",
}


def parse_override_kv(text: str) -> tuple[str, Any]:
    """`KEY=TYPE:VALUE` (types int, float, bool, str) as llama.cpp's --override-kv; ValueError otherwise."""
    key, sep, rest = text.partition("=")
    kind, sep2, value = rest.partition(":")
    if not sep or not sep2 or not key or kind not in _TYPES:
        raise ValueError(f"invalid type for KV override: {text!r} (expected KEY=int|float|bool|str:VALUE)")
    if kind == "bool":
        if value not in ("true", "false"):
            raise ValueError(f"invalid boolean value for KV override: {text!r}")
        return key, value == "true"
    try:
        return key, _TYPES[kind](value)  # type: ignore[misc]
    except ValueError:
        raise ValueError(f"invalid {kind} value for KV override: {text!r}") from None


def open_with_overrides(
    path: str, overrides: tuple[tuple[str, Any], ...], rope_freq_base: float | None
) -> Any:
    """The model file to build the engine from: the path itself when nothing is overridden, else the opened
    file with its header and metadata changed."""
    if not overrides and rope_freq_base is None:
        return path
    gguf: GGUFFile = open_gguf(path)
    arch = gguf.header.architecture
    items = list(overrides)
    if rope_freq_base is not None:
        items.append((f"{arch}.rope.freq_base", float(rope_freq_base)))
    changes: dict[str, Any] = {}
    metadata = dict(gguf.metadata)
    for key, value in items:
        metadata[key] = value
        field = _HEADER_KEYS.get(key.removeprefix(arch + "."))
        if key.startswith(arch + ".") and field is not None:
            changes[field] = value
    # cached properties of the opened file: set once here, before anything reads them
    gguf.__dict__["metadata"] = metadata
    gguf.__dict__["header"] = dataclasses.replace(gguf.header, **changes)
    return gguf
