"""The KV cache element types (llama.cpp's ``-ctk/-ctv`` values) and how a cache row of each is stored.

f32 and f16 rows are numpy float arrays (the attention kernels take an f16 layer as its uint16 bits). bf16
and the block types are stored as ggml stores them: a row of ``kv_dim`` values is ``row_bytes`` bytes of
ggml blocks (uint8), written with llama-quant's quantizers (the bytes ``ggml_set_rows`` writes: the type's
``from_float``; IQ4_NL's is ``ops.kv_rows``) and read back with its block decoders, so a cache row is byte for byte llama.cpp's.

llama.cpp's rules (``llama_init_from_model``): a quantized V cache needs flash attention (``auto`` turns it
on, ``off`` is an error); with flash attention, a block type's block size must divide the head size.

A block-type cache is also rotated as llama.cpp rotates it (``llama_kv_cache``'s attention rotation): when
the head size is a multiple of 64, q and k go through an orthonormal Walsh-Hadamard transform (``n_rot_k``:
the largest power of two from 64 on dividing the head size) before K is stored, and v and the attention's
output through one of 64 (``n_rot_v``); ``LLAMA_ATTN_ROT_DISABLE=1`` turns it off, as in llama.cpp.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

__all__ = [
    "FLASH_ATTN_VALUES",
    "KV_TYPES",
    "KVType",
    "decode_rows",
    "encode_rows",
    "flash_attn_mode",
    "kv_type",
    "resolve_flash_attn",
    "rotation_sizes",
]

T = GGMLQuantizationType


@dataclass(frozen=True, slots=True)
class KVType:
    """One cache element type: its name, ggml type, the kernels' code for it, and its block geometry."""

    name: str
    qtype: GGMLQuantizationType
    code: int  # the attention kernels' switch value (``ops.flash_attn`` KIND_*)
    block: int  # values per block (1 for the float types)
    block_bytes: int

    @property
    def quantized(self) -> bool:
        """A block type (ggml_is_quantized): bf16, f16 and f32 are not."""
        return self.block > 1

    @property
    def float_array(self) -> bool:
        """Stored as a numpy float array (f32, f16) rather than as raw ggml bytes."""
        return self.name in ("f32", "f16")

    def row_bytes(self, n: int) -> int:
        """Bytes of a row of n values (ggml_row_size)."""
        return n // self.block * self.block_bytes

    def zeros(self, n_rows: int, n: int) -> np.ndarray:
        """A zeroed layer of n_rows rows of n values in this type's storage."""
        if self.name == "f32":
            return np.zeros((n_rows, n), np.float32)
        if self.name == "f16":
            return np.zeros((n_rows, n), np.float16)
        return np.zeros((n_rows, self.row_bytes(n)), np.uint8)


def _make(name: str, qtype: GGMLQuantizationType, code: int) -> KVType:
    block, size = GGML_QUANT_SIZES[qtype]
    return KVType(name, qtype, code, block, size)


# llama.cpp's kv_cache_types (common/arg.cpp), in its order; codes as ops.flash_attn's KIND_* constants
KV_TYPES: dict[str, KVType] = {
    t.name: t
    for t in (
        _make("f32", T.F32, 0),
        _make("f16", T.F16, 1),
        _make("bf16", T.BF16, 2),
        _make("q8_0", T.Q8_0, 3),
        _make("q4_0", T.Q4_0, 4),
        _make("q4_1", T.Q4_1, 5),
        _make("iq4_nl", T.IQ4_NL, 6),
        _make("q5_0", T.Q5_0, 7),
        _make("q5_1", T.Q5_1, 8),
    )
}


def kv_type(name: str) -> KVType:
    """The cache type of a name; ValueError naming the allowed ones otherwise (llama.cpp's message)."""
    t = KV_TYPES.get(name)
    if t is None:
        raise ValueError(f"Unsupported cache type: {name} (allowed values: {', '.join(KV_TYPES)})")
    return t


def encode_rows(t: KVType, x: np.ndarray) -> np.ndarray:
    """float32 rows [m, n] as the cache stores them (``KVType.zeros`` layout): the bytes ggml_set_rows
    writes (f16 / bf16 rounded to nearest even, block types through llama-quant's quantizers)."""
    x = np.ascontiguousarray(x, np.float32)
    m, n = x.shape
    if t.name == "f32":
        return x.copy()
    if t.name == "f16":
        return x.astype(np.float16)
    if t.name == "bf16":
        return _to_bf16_bits(x).view(np.uint8).reshape(m, 2 * n)
    from llama_quant.registry import get_format

    out = np.empty(m * t.row_bytes(n), np.uint8)
    if t.qtype == T.IQ4_NL:  # its from_float is not the file quantizer (ops.kv_rows)
        from .ops.kv_rows import quantize_iq4_nl_ref

        quantize_iq4_nl_ref(x.reshape(-1), m, n, out)
        return out.reshape(m, t.row_bytes(n))
    quantize = get_format(t.qtype).quantize_kernel
    assert quantize is not None
    quantize(x.reshape(-1), np.zeros(0, np.float32), m, n, out)
    return out.reshape(m, t.row_bytes(n))


def decode_rows(t: KVType, rows: np.ndarray, n: int) -> np.ndarray:
    """Stored rows [m, ...] back to float32 [m, n] (ggml's to_float)."""
    m = len(rows)
    if t.float_array:
        return rows.astype(np.float32)
    if t.name == "bf16":
        bits = np.ascontiguousarray(rows).view(np.uint16).astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32).reshape(m, n)
    from llama_quant.registry import get_format

    out = np.empty(m * n, np.float32)
    dequantize = get_format(t.qtype).dequantize_kernel
    assert dequantize is not None
    dequantize(np.ascontiguousarray(rows).reshape(-1), m * n, out)
    return out.reshape(m, n)


def _to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16: round to nearest even; a NaN stays a quiet NaN."""
    u = x.view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    quiet = (u >> np.uint32(16)) | np.uint32(64)
    return np.where(nan, quiet, rounded).astype(np.uint16)


FLASH_ATTN_VALUES = ("on", "off", "auto")
# llama.cpp's -fa spellings (common/arg.cpp is_truthy / is_falsey / is_autoy)
_FA_SPELLINGS = (
    dict.fromkeys(("on", "enabled", "true", "1"), "on")
    | dict.fromkeys(("off", "disabled", "false", "0"), "off")
    | dict.fromkeys(("auto", "-1"), "auto")
)


def flash_attn_mode(value: str) -> str | None:
    """``on``, ``off`` or ``auto`` for a ``-fa`` value in any of llama.cpp's spellings, None if it is none."""
    return _FA_SPELLINGS.get(value.strip().lower())


def resolve_flash_attn(flash_attn: str, type_k: str, type_v: str, head_dim: int) -> bool:
    """Whether attention runs as flash attention, by llama.cpp's rules (``llama_init_from_model``).

    ``auto`` is off here (the f16 path without flash attention is the engine's tested default) unless a
    quantized V cache needs it, which turns it on as llama.cpp does; ``off`` with a quantized V cache is
    llama.cpp's error; with flash attention, a block type's block size must divide the head size.
    """
    if flash_attn not in FLASH_ATTN_VALUES:
        raise ValueError(f"unknown value for --flash-attn: '{flash_attn}' (on, off or auto)")
    k, v = kv_type(type_k), kv_type(type_v)
    fa = flash_attn == "on"
    if v.quantized and not fa:
        if flash_attn == "off":
            raise ValueError("quantized V cache requires flash_attn to be enabled")
        fa = True
    if fa:
        for name, t in (("K", k), ("V", v)):
            if t.quantized and head_dim % t.block:
                raise ValueError(
                    f"{name} cache type {t.name} with block size {t.block} does not divide "
                    f"n_embd_head_{name.lower()}={head_dim}"
                )
    elif k.quantized and head_dim % k.block:  # mul_mat needs whole blocks per row
        raise ValueError(
            f"K cache type {k.name} with block size {k.block} does not divide n_embd_head_k={head_dim}"
        )
    return fa


def rotation_sizes(type_k: str, type_v: str, head_dim: int) -> tuple[int, int]:
    """llama.cpp's (n_rot_k, n_rot_v) for these cache types and head size (0: no rotation)."""
    if int(os.environ.get("LLAMA_ATTN_ROT_DISABLE", "0") or "0") or head_dim <= 0 or head_dim % 64:
        return 0, 0
    rot_k = 0
    if kv_type(type_k).quantized:
        rot_k = 64
        while head_dim % (2 * rot_k) == 0:
            rot_k *= 2
    return rot_k, 64 if kv_type(type_v).quantized else 0
