# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""Row data validation: llama.cpp's ``ggml_validate_row_data`` (ggml-quants.c).

llama-quantize checks every byte range it reads from the input (the model loader runs with
``check_tensors``) and every chunk it quantizes: no NaN or infinity in F32 / F16 / BF16 / F64 data, none in
the fp16 (or fp32) scales of the block formats, no 0xff exponent in MXFP4's E8M0 scales. The first bad
value is reported with its block index, as ggml prints it.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from llama_quant.formats.common import f32_bits, f32_from_bits

__all__ = [
    "SCALE_FIELDS",
    "decode_f16",
    "f16_to_f32_checked",
    "row_data_error",
    "validate_f16_fields",
    "validate_f32_fields",
]

_SUBNORMAL_MAGIC = np.float32(2.0**-14)  # 113 << 23: fp16 subnormals are (mantissa + 2**-14) - 2**-14

# byte offsets of the fp16 scale fields inside one block (the d / m / dmin members of ggml's block structs)
SCALE_FIELDS: dict[T, tuple[int, ...]] = {
    T.F16: (0,),
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q2_K: (80, 82),  # scales[16], qs[64], d, dmin
    T.Q3_K: (108,),  # hmask[32], qs[64], scales[12], d
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),  # ql[128], qh[64], scales[16], d
    T.TQ1_0: (52,),  # qs[48], qh[4], d
    T.TQ2_0: (64,),  # qs[64], d
    T.IQ1_S: (0,),
    T.IQ2_XXS: (0,),
    T.IQ2_XS: (0,),
    T.IQ2_S: (0,),
    T.IQ3_XXS: (0,),
    T.IQ3_S: (0,),
    T.IQ4_XS: (0,),
    T.IQ4_NL: (0,),
}
if hasattr(T, "Q1_0"):
    SCALE_FIELDS[T.Q1_0] = (0,)
_F32_FIELDS: dict[T, tuple[int, ...]] = {T.F32: (0,), T.Q8_K: (0,)}
_NOTHING = {T.I8, T.I16, T.I32, T.I64}
if hasattr(T, "NVFP4"):
    _NOTHING.add(T.NVFP4)  # UE4M3 scales: every byte value is valid


@njit(cache=True, error_model="numpy")
def validate_f16_fields(raw, block_bytes, offsets, found):
    """Index of the first block with an fp16 field whose exponent is all ones (``found[0]``: 1 inf, 2 nan).

    ``raw`` uint8[n * block_bytes]; returns -1 when every field is finite.
    """
    nb = raw.size // block_bytes
    for i in range(nb):
        base = i * block_bytes
        for k in range(offsets.size):
            o = base + offsets[k]
            h = np.uint16(raw[o]) | (np.uint16(raw[o + 1]) << np.uint16(8))
            if (h & np.uint16(0x7C00)) == np.uint16(0x7C00):
                found[0] = 1 if (h & np.uint16(0x03FF)) == np.uint16(0) else 2
                return i
    return -1


_CHUNK = 1 << 14  # values per reduction chunk (and per parallel work item of the F16 decode)


@njit(cache=True, error_model="numpy")
def _scan_f16(h, found):
    # contiguous fp16 values: (h & 0x7c00) is at most 0x7c00, so a chunk's max finds inf/nan without
    # branches (vpmaxuw); the exact position is looked up only in a bad chunk
    n = h.size
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        mx = np.uint16(0)
        for j in range(lo, hi):
            mx = max(mx, h[j] & np.uint16(0x7C00))
        if mx == np.uint16(0x7C00):
            for j in range(lo, hi):
                if (h[j] & np.uint16(0x7C00)) == np.uint16(0x7C00):
                    found[0] = 1 if (h[j] & np.uint16(0x03FF)) == np.uint16(0) else 2
                    return j
    return -1


@njit(cache=True, parallel=True, error_model="numpy")
def f16_to_f32_checked(h, out, first_bad):
    """Decode fp16 bits ``h`` (uint16[n]) into ``out`` (float32[n]) and validate them in the same pass.

    Exact for every finite value, as GGML_FP16_TO_FP32 (integer re-biasing of the exponent; subnormals
    through one exact float subtraction). ``first_bad`` int64[n_chunks] receives, per chunk of _CHUNK
    values, the index of its first inf / nan or -1. Returns the index of the first one overall, or -1.
    """
    n = h.size
    o = out.view(np.uint32)
    nch = (n + _CHUNK - 1) // _CHUNK
    for c in prange(nch):
        lo = c * _CHUNK
        hi = min(n, lo + _CHUNK)
        mx = np.uint32(0)
        for i in range(lo, hi):
            x = np.uint32(h[i])
            m = (x & np.uint32(0x7FFF)) << np.uint32(13)
            e = m & np.uint32(0x0F800000)
            mx = max(mx, e)
            u = m + np.uint32(0x38000000)  # (127 - 15) << 23
            u = u + np.uint32(0x38000000) if e == np.uint32(0x0F800000) else u  # inf / nan: exponent 0xff
            sub = f32_bits(f32_from_bits(u + np.uint32(0x00800000)) - _SUBNORMAL_MAGIC)
            u = sub if e == np.uint32(0) else u
            o[i] = u | ((x & np.uint32(0x8000)) << np.uint32(16))
        first_bad[c] = -1
        if mx == np.uint32(0x0F800000):
            for i in range(lo, hi):
                if (h[i] & np.uint16(0x7C00)) == np.uint16(0x7C00):
                    first_bad[c] = i
                    break
    for c in range(nch):
        if first_bad[c] >= 0:
            return first_bad[c]
    return -1


@njit(cache=True, error_model="numpy")
def validate_f32_fields(raw, block_bytes, offsets, found):
    """As :func:`validate_f16_fields` for float32 fields (F32 data, Q8_K's d)."""
    nb = raw.size // block_bytes
    for i in range(nb):
        base = i * block_bytes
        for k in range(offsets.size):
            o = base + offsets[k]
            u = (
                np.uint32(raw[o])
                | (np.uint32(raw[o + 1]) << np.uint32(8))
                | (np.uint32(raw[o + 2]) << np.uint32(16))
                | (np.uint32(raw[o + 3]) << np.uint32(24))
            )
            if (u & np.uint32(0x7F800000)) == np.uint32(0x7F800000):
                found[0] = 1 if (u & np.uint32(0x007FFFFF)) == np.uint32(0) else 2
                return i
    return -1


@njit(cache=True, error_model="numpy")
def _scan_f32(u, found):
    n = u.size
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        mx = np.uint32(0)
        for j in range(lo, hi):
            mx = max(mx, u[j] & np.uint32(0x7F800000))
        if mx == np.uint32(0x7F800000):
            for j in range(lo, hi):
                if (u[j] & np.uint32(0x7F800000)) == np.uint32(0x7F800000):
                    found[0] = 1 if (u[j] & np.uint32(0x007FFFFF)) == np.uint32(0) else 2
                    return j
    return -1


def decode_f16(h: np.ndarray, out: np.ndarray) -> str | None:
    """``out[:] =`` fp16 bits ``h`` as float32, checked on the way: None, or why ggml would refuse ``h``."""
    i = int(f16_to_f32_checked(h, out, np.empty(-(-h.size // _CHUNK), dtype=np.int64)))
    if i < 0:
        return None
    return f"found {'inf' if (int(h[i]) & 0x3FF) == 0 else 'nan'} value at block {i}"


_KIND = {1: "inf", 2: "nan"}
_KNOWN = {*SCALE_FIELDS, *_F32_FIELDS, *_NOTHING, T.BF16, T.F64, T.MXFP4, T.IQ1_M}


def _aligned(raw: np.ndarray, dtype: type) -> np.ndarray:
    if raw.ctypes.data % np.dtype(dtype).itemsize:
        raw = raw.copy()
    return raw.view(dtype)


def row_data_error(qtype: T | int, raw: np.ndarray, block0: int = 0) -> str | None:
    """Why llama.cpp's ``ggml_validate_row_data`` would refuse these bytes, or None when it accepts them.

    ``block0`` is added to the block index in the message (the bytes start at that block of a tensor).
    """
    qtype = T(int(qtype))
    raw = np.asarray(raw).reshape(-1).view(np.uint8)
    size = GGML_QUANT_SIZES.get(qtype, (0, 0))[1]
    if size == 0 or qtype not in _KNOWN:
        return f"invalid type {qtype.name}"
    if raw.size % size:
        return f"invalid size {raw.size} for type {qtype.name} (type size = {size})"
    if qtype in _NOTHING or raw.size == 0:
        return None
    found = np.zeros(1, dtype=np.int64)
    if qtype == T.F16:
        i = _scan_f16(_aligned(raw, np.uint16), found)
    elif qtype == T.F32:
        i = _scan_f32(_aligned(raw, np.uint32), found)
    elif qtype in SCALE_FIELDS:
        i = validate_f16_fields(raw, size, np.array(SCALE_FIELDS[qtype], dtype=np.int64), found)
    elif qtype in _F32_FIELDS:
        i = validate_f32_fields(raw, size, np.array(_F32_FIELDS[qtype], dtype=np.int64), found)
    else:
        return _other_error(qtype, raw, size, block0)
    return None if i < 0 else f"found {_KIND[int(found[0])]} value at block {block0 + i}"


def _other_error(qtype: T, raw: np.ndarray, size: int, block0: int) -> str | None:
    """The rarer layouts, in numpy: BF16 (counts, as ggml prints them), F64, MXFP4, IQ1_M."""
    if qtype == T.BF16:
        a = (_aligned(raw, np.uint16) & 0x7FFF).astype(np.uint16)
        nans, infs = int(np.count_nonzero(a > 0x7F80)), int(np.count_nonzero(a == 0x7F80))
        if nans:
            return f"found {nans} NaNs in row of {a.size} BF16 values"
        if infs:
            return f"found {infs} infinities in row of {a.size} BF16 values"
        return None
    if qtype == T.F64:
        bad = ~np.isfinite(_aligned(raw, np.float64))
    elif qtype == T.MXFP4:
        e = raw.reshape(-1, size)[:, 0]
        bad = e == 0xFF
        if bad.any():
            i = int(np.argmax(bad))
            return f"found invalid e value 255 at block {block0 + i}"
        return None
    else:  # IQ1_M: the fp16 scale is spread over the top nibbles of the four uint16 scales (bytes 48..55)
        sc = np.ascontiguousarray(raw.reshape(-1, size)[:, 48:56]).view(np.uint16).astype(np.uint32)
        h = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
        bad = (h & 0x7C00) == 0x7C00
        if bad.any():
            i = int(np.argmax(bad))
            return f"found {'inf' if (h[i] & 0x3FF) == 0 else 'nan'} value at block {block0 + i}"
        return None
    if bad.any():
        i = int(np.argmax(bad))
        v = _aligned(raw, np.float64)[i]
        return f"found {'nan' if np.isnan(v) else 'inf'} value at block {block0 + i}"
    return None
