"""Typed, frozen views of a model's metadata, built once: `ModelHeader` and `TokenizerData`.

Keys follow llama.cpp's naming (`{arch}.embedding_length`, `tokenizer.ggml.tokens`, ...). A required key that
is missing, or any key stored with a type other than the one it is read as, is a `GGUFError` naming the key;
values are range-checked here, where they are consumed, so later code can trust them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .constants import GGUFValueType
from .errors import GGUFError
from .reader import Field

__all__ = ["ModelHeader", "TokenizerData"]

_INT_TYPES = frozenset(
    {
        GGUFValueType.UINT8,
        GGUFValueType.INT8,
        GGUFValueType.UINT16,
        GGUFValueType.INT16,
        GGUFValueType.UINT32,
        GGUFValueType.INT32,
        GGUFValueType.UINT64,
        GGUFValueType.INT64,
    }
)
_FLOAT_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})
# Bounds that no real model exceeds; they keep later allocations (KV cache, per-layer lists) sane.
_MAX_LAYERS = 100_000
_MAX_DIM = 1 << 24
_MAX_CONTEXT = 1 << 31


class _Keys:
    """Typed access to a field mapping, with errors that name the key and the file."""

    def __init__(self, fields: Mapping[str, Field], source: str) -> None:
        self.fields = fields
        self.source = source

    def fail(self, key: str, what: str) -> GGUFError:
        return GGUFError(f"{self.source}: metadata key {key!r} {what}")

    def _get(self, key: str, required: bool) -> Field | None:
        f = self.fields.get(key)
        if f is None and required:
            raise self.fail(key, "is required but missing")
        return f

    def string(self, key: str, required: bool = False) -> str | None:
        f = self._get(key, required)
        if f is None:
            return None
        if f.value_type != GGUFValueType.STRING:
            raise self.fail(key, f"must be a string, found {f.value_type.name}")
        return str(f.value)

    def integer(self, key: str, required: bool = False, lo: int = 0, hi: int = _MAX_DIM) -> int | None:
        f = self._get(key, required)
        if f is None:
            return None
        if f.value_type not in _INT_TYPES:
            raise self.fail(key, f"must be an integer, found {f.value_type.name}")
        return self._check_range(key, int(f.value), lo, hi)

    def per_layer(
        self, key: str, n_layer: int, required: bool = False, lo: int = 0, hi: int = _MAX_DIM
    ) -> int | tuple[int, ...] | None:
        """An integer, or an array of one integer per layer."""
        f = self._get(key, required)
        if f is None or f.value_type != GGUFValueType.ARRAY:
            return self.integer(key, required, lo, hi)
        if f.array_type not in _INT_TYPES:
            raise self.fail(key, "must be an integer or an array of integers")
        values = tuple(int(v) for v in f.value)
        if len(values) != n_layer:
            raise self.fail(key, f"has {len(values)} entries, expected one per layer ({n_layer})")
        return tuple(self._check_range(key, v, lo, hi) for v in values)

    def _check_range(self, key: str, v: int, lo: int, hi: int) -> int:
        if not lo <= v <= hi:
            raise self.fail(key, f"is {v}, outside the valid range {lo}..{hi}")
        return v

    def number(self, key: str, required: bool = False, positive: bool = False) -> float | None:
        f = self._get(key, required)
        if f is None:
            return None
        if f.value_type not in _FLOAT_TYPES and f.value_type not in _INT_TYPES:
            raise self.fail(key, f"must be a number, found {f.value_type.name}")
        v = float(f.value)
        if not math.isfinite(v) or (positive and v <= 0):
            raise self.fail(key, f"is {v}, expected a {'positive ' if positive else ''}finite number")
        return v

    def boolean(self, key: str) -> bool | None:
        f = self._get(key, False)
        if f is None:
            return None
        if f.value_type != GGUFValueType.BOOL:
            raise self.fail(key, f"must be a bool, found {f.value_type.name}")
        return bool(f.value)

    def array(self, key: str, item_types: frozenset[GGUFValueType], what: str) -> Any:
        f = self._get(key, False)
        if f is None:
            return None
        if f.value_type != GGUFValueType.ARRAY or f.array_type not in item_types:
            found = f.value_type.name if f.array_type is None else f"array of {f.array_type.name}"
            raise self.fail(key, f"must be an array of {what}, found {found}")
        return f.value


@dataclass(frozen=True, slots=True)
class ModelHeader:
    """Architecture and hyperparameters of a model (llama.cpp's `llama_hparams`, as far as GGUF states them).

    Per-layer values (`head_count`, `head_count_kv`, `feed_forward_length`) are an int when uniform, or a
    tuple with one entry per layer when the file stores an array.
    """

    architecture: str
    name: str | None
    context_length: int
    embedding_length: int
    block_count: int
    feed_forward_length: int | tuple[int, ...] | None
    head_count: int | tuple[int, ...]
    head_count_kv: int | tuple[int, ...]
    key_length: int
    value_length: int
    rope_dimension_count: int | None
    rope_freq_base: float | None
    rope_freq_base_swa: float | None
    rope_scaling_type: str | None
    rope_scaling_factor: float | None
    layer_norm_rms_epsilon: float | None
    layer_norm_epsilon: float | None
    sliding_window: int | None
    vocab_size: int
    expert_count: int | None
    expert_used_count: int | None
    attn_logit_softcapping: float | None
    final_logit_softcapping: float | None
    file_type: int | None

    @classmethod
    def from_fields(cls, fields: Mapping[str, Field], source: str = "model") -> ModelHeader:
        """Build and validate the header; `source` names the file in error messages."""
        k = _Keys(fields, source)
        arch = k.string("general.architecture", required=True)
        assert arch is not None
        if not arch or not arch.replace("_", "").replace("-", "").isalnum():
            raise k.fail("general.architecture", f"has an invalid value {arch!r}")
        a = arch + "."
        n_layer = k.integer(a + "block_count", required=True, lo=1, hi=_MAX_LAYERS)
        n_embd = k.integer(a + "embedding_length", required=True, lo=1)
        n_head = k.per_layer(a + "attention.head_count", n_layer or 0, required=True)
        assert n_layer is not None and n_embd is not None and n_head is not None  # required=True
        n_head_kv = k.per_layer(a + "attention.head_count_kv", n_layer)
        if n_head_kv is None:
            n_head_kv = n_head
        max_head = max(n_head) if isinstance(n_head, tuple) else n_head
        default_head_dim = n_embd // max_head if max_head and n_embd % max_head == 0 else 0
        key_length = k.integer(a + "attention.key_length", lo=1)
        value_length = k.integer(a + "attention.value_length", lo=1)
        if (key_length is None or value_length is None) and not default_head_dim:
            raise k.fail(
                a + "attention.key_length",
                f"is missing and embedding_length {n_embd} is not divisible by head_count {max_head}",
            )
        vocab = k.integer(a + "vocab_size", lo=1, hi=_MAX_CONTEXT)
        if vocab is None:
            tokens = fields.get("tokenizer.ggml.tokens")
            vocab = len(tokens.value) if tokens is not None and tokens.array_type is not None else 0
        return cls(
            architecture=arch,
            name=k.string("general.name"),
            context_length=int(k.integer(a + "context_length", required=True, lo=1, hi=_MAX_CONTEXT) or 0),
            embedding_length=n_embd,
            block_count=n_layer,
            feed_forward_length=k.per_layer(a + "feed_forward_length", n_layer),
            head_count=n_head,
            head_count_kv=n_head_kv,
            key_length=int(key_length or default_head_dim),
            value_length=int(value_length or default_head_dim),
            rope_dimension_count=k.integer(a + "rope.dimension_count"),
            rope_freq_base=k.number(a + "rope.freq_base", positive=True),
            rope_freq_base_swa=k.number(a + "rope.freq_base_swa", positive=True),
            rope_scaling_type=k.string(a + "rope.scaling.type"),
            rope_scaling_factor=k.number(a + "rope.scaling.factor"),
            layer_norm_rms_epsilon=k.number(a + "attention.layer_norm_rms_epsilon", positive=True),
            layer_norm_epsilon=k.number(a + "attention.layer_norm_epsilon", positive=True),
            sliding_window=k.integer(a + "attention.sliding_window", hi=_MAX_CONTEXT),
            vocab_size=int(vocab),
            expert_count=k.integer(a + "expert_count"),
            expert_used_count=k.integer(a + "expert_used_count"),
            attn_logit_softcapping=k.number(a + "attn_logit_softcapping"),
            final_logit_softcapping=k.number(a + "final_logit_softcapping"),
            file_type=k.integer("general.file_type", hi=1 << 16),
        )


_SPECIAL_KEYS = {
    "bos_id": "tokenizer.ggml.bos_token_id",
    "eos_id": "tokenizer.ggml.eos_token_id",
    "unk_id": "tokenizer.ggml.unknown_token_id",
    "sep_id": "tokenizer.ggml.seperator_token_id",
    "pad_id": "tokenizer.ggml.padding_token_id",
    "mask_id": "tokenizer.ggml.mask_token_id",
    "eot_id": "tokenizer.ggml.eot_token_id",
    "eom_id": "tokenizer.ggml.eom_token_id",
    "fim_pre_id": "tokenizer.ggml.fim_pre_token_id",
    "fim_suf_id": "tokenizer.ggml.fim_suf_token_id",
    "fim_mid_id": "tokenizer.ggml.fim_mid_token_id",
    "fim_pad_id": "tokenizer.ggml.fim_pad_token_id",
    "fim_rep_id": "tokenizer.ggml.fim_rep_token_id",
    "fim_sep_id": "tokenizer.ggml.fim_sep_token_id",
}


@dataclass(frozen=True, slots=True)
class TokenizerData:
    """Everything a tokenizer is built from (llama.cpp's `llama_vocab::load` inputs).

    `scores` is a float32 array and `token_types` an int32 array (one per token) or None when the file
    has none; special ids are validated to lie inside the vocabulary.
    """

    model: str
    pre: str | None
    tokens: tuple[str, ...]
    scores: np.ndarray | None
    token_types: np.ndarray | None
    merges: tuple[str, ...] | None
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    sep_id: int | None
    pad_id: int | None
    mask_id: int | None
    eot_id: int | None
    eom_id: int | None
    fim_pre_id: int | None
    fim_suf_id: int | None
    fim_mid_id: int | None
    fim_pad_id: int | None
    fim_rep_id: int | None
    fim_sep_id: int | None
    add_bos: bool | None
    add_eos: bool | None
    add_sep: bool | None
    add_space_prefix: bool | None
    remove_extra_whitespaces: bool | None
    chat_template: str | None
    chat_templates: dict[str, str]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_fields(cls, fields: Mapping[str, Field], source: str = "model") -> TokenizerData:
        """Build and validate tokenizer data; a file without `tokenizer.ggml.model` is an error."""
        k = _Keys(fields, source)
        model = k.string("tokenizer.ggml.model", required=True)
        assert model is not None
        tokens = k.array("tokenizer.ggml.tokens", frozenset({GGUFValueType.STRING}), "strings")
        if tokens is None:
            if model != "none":
                raise k.fail("tokenizer.ggml.tokens", "is required but missing")
            tokens = []
        n = len(tokens)
        scores = k.array("tokenizer.ggml.scores", frozenset({GGUFValueType.FLOAT32}), "float32")
        types = k.array("tokenizer.ggml.token_type", frozenset({GGUFValueType.INT32}), "int32")
        for key, arr in (("tokenizer.ggml.scores", scores), ("tokenizer.ggml.token_type", types)):
            if arr is not None and len(arr) != n:
                raise k.fail(key, f"has {len(arr)} entries but there are {n} tokens")
        merges = k.array("tokenizer.ggml.merges", frozenset({GGUFValueType.STRING}), "strings")
        specials: dict[str, int | None] = {}
        for attr, key in _SPECIAL_KEYS.items():
            v = k.integer(key, lo=-1, hi=(1 << 32) - 1)
            # -1 (or its uint32 image) means "no such token" in llama.cpp's converters.
            if v is None or v in (-1, 0xFFFFFFFF):
                specials[attr] = None
            elif not 0 <= v < n:
                raise k.fail(key, f"is {v}, outside the vocabulary of {n} tokens")
            else:
                specials[attr] = v
        templates = {
            key.removeprefix("tokenizer.chat_template."): str(k.string(key))
            for key in fields
            if key.startswith("tokenizer.chat_template.")
        }
        return cls(
            model=model,
            pre=k.string("tokenizer.ggml.pre"),
            tokens=tuple(tokens),
            scores=None if scores is None else np.asarray(scores, dtype=np.float32),
            token_types=None if types is None else np.asarray(types, dtype=np.int32),
            merges=None if merges is None else tuple(merges),
            add_bos=k.boolean("tokenizer.ggml.add_bos_token"),
            add_eos=k.boolean("tokenizer.ggml.add_eos_token"),
            add_sep=k.boolean("tokenizer.ggml.add_sep_token"),
            add_space_prefix=k.boolean("tokenizer.ggml.add_space_prefix"),
            remove_extra_whitespaces=k.boolean("tokenizer.ggml.remove_extra_whitespaces"),
            chat_template=k.string("tokenizer.chat_template"),
            chat_templates=templates,
            **specials,
        )
