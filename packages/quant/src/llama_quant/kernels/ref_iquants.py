"""Plain-numpy references of the i-quant and ternary products (IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0 and the
grid types IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), for tests and for packing.

``decode`` gives the integers ggml's generic vec_dot multiplies (ggml-cpu/quants.c ``ggml_vec_dot_*_generic``)
straight from the raw blocks; ``matmul_k`` runs those functions' integer sums and float steps as written
there, in f32 numpy (one ufunc per C operation). The 32-value types IQ4_NL and MXFP4 decode to the shape
of Q8_0 and take ``ref.matmul``'s 32-value path.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from ..formats.grids import (
    IQ1S_GRID,
    IQ2S_GRID,
    IQ2XS_GRID,
    IQ2XXS_GRID,
    IQ3S_GRID,
    IQ3XXS_GRID,
    KSIGNS_IQ2XS,
)
from ..formats.iq4 import KVALUES_IQ4NL
from ..formats.mxfp4 import KVALUES_MXFP4

__all__ = ["BLOCKS", "GRID_TYPES", "decode", "e8m0_half", "matmul_k"]

f32 = np.float32
i64 = np.int64

# (values per block, bytes per block) of every type here
BLOCKS = {
    T.IQ4_NL: (32, 18),
    T.MXFP4: (32, 17),
    T.IQ4_XS: (256, 136),
    T.TQ1_0: (256, 54),
    T.TQ2_0: (256, 66),
    T.IQ2_XXS: (256, 66),
    T.IQ2_XS: (256, 74),
    T.IQ2_S: (256, 82),
    T.IQ3_XXS: (256, 98),
    T.IQ3_S: (256, 110),
    T.IQ1_S: (256, 50),
    T.IQ1_M: (256, 56),
}
# the factor ggml's vec_dot applies to the whole sum (``*s = 0.125f * sumf``), 1 when none
GRID_TYPES = {T.IQ2_XXS: 0.125, T.IQ2_XS: 0.125, T.IQ2_S: 0.125, T.IQ3_XXS: 0.25, T.IQ3_S: 1.0}
_IQ1_DELTA = f32(0.125)  # IQ1S_DELTA, IQ1M_DELTA
_INT = {name: np.asarray(g, np.int64) for name, g in (("1s", IQ1S_GRID), ("2s", IQ2S_GRID))}
_INT |= {"2xs": np.asarray(IQ2XS_GRID, i64), "2xxs": np.asarray(IQ2XXS_GRID, i64)}
_INT |= {"3s": np.asarray(IQ3S_GRID, i64), "3xxs": np.asarray(IQ3XXS_GRID, i64)}


def _f16(b: np.ndarray, o: int) -> np.ndarray:
    return b[..., o : o + 2].copy().view(np.float16)[..., 0].astype(f32)


def _words(b: np.ndarray, o: int, n: int, dtype: str) -> np.ndarray:
    """n little-endian words of ``dtype`` from byte o of every block: int64 [..., n]."""
    size = np.dtype(dtype).itemsize
    return b[..., o : o + n * size].copy().view(dtype).astype(i64)


def _bits(s: np.ndarray) -> np.ndarray:
    """Bits 0..7 of every byte of s as +1 (clear) or -1 (set): [..., 8]."""
    return 1 - 2 * ((s[..., None] >> np.arange(8)) & 1)


def _nibble_scales(s: np.ndarray) -> np.ndarray:
    """``2 * nibble + 1`` of each byte's low then high nibble: the IQ2_XS / IQ2_S scale of each 16 values."""
    return np.stack([2 * (s & 15) + 1, 2 * (s >> 4) + 1], axis=-1).reshape(*s.shape[:-1], -1)


def _iq4(b: np.ndarray, o: int, table: np.ndarray) -> np.ndarray:
    """Blocks of 16 bytes at o of 4-bit indices into ``table``: low nibbles first, then high (32 values)."""
    qs = b[..., o:].astype(i64).reshape(*b.shape[:-1], -1, 16)
    t = table.astype(i64)
    return np.concatenate([t[qs & 15], t[qs >> 4]], axis=-1).reshape(*b.shape[:-1], -1)


def _trit(byte: np.ndarray, k: int) -> np.ndarray:
    return (((byte * 3**k) & 0xFF) * 3 >> 8) - 1


def _decode_ternary(qtype: T, b: np.ndarray) -> dict[str, np.ndarray]:
    lead = b.shape[:-1]
    if qtype == T.TQ2_0:
        qs = b[..., 0:64].astype(i64).reshape(*lead, 2, 1, 32)
        q = ((qs >> (2 * np.arange(4))[:, None]) & 3) - 1  # [.., half, l, 32]: position 128 h + 32 l + k
        return {"d": _f16(b, 64), "q": q.reshape(*lead, 256)}
    qs = b[..., 0:48].astype(i64)
    qh = b[..., 48:52].astype(i64)
    parts = [np.stack([_trit(qs[..., :32], k) for k in range(5)], axis=-2).reshape(*lead, 160)]
    parts.append(np.stack([_trit(qs[..., 32:], k) for k in range(5)], axis=-2).reshape(*lead, 80))
    parts.append(np.stack([_trit(qh, k) for k in range(4)], axis=-2).reshape(*lead, 16))
    return {"d": _f16(b, 52), "q": np.concatenate(parts, axis=-1)}


def _decode_iq2(qtype: T, b: np.ndarray) -> dict[str, np.ndarray]:
    lead = b.shape[:-1]
    if qtype == T.IQ2_XXS:
        w = _words(b, 2, 16, "<u4")
        w0, w1 = w[..., 0::2], w[..., 1::2]  # [.., 8]: four grid indices; signs and scale
        grid = _INT["2xxs"][(w0[..., None] >> (8 * np.arange(4))) & 255]  # [.., 8, 4, 8]
        signs = _bits(KSIGNS_IQ2XS[(w1[..., None] >> (7 * np.arange(4))) & 127].astype(i64))
        sc = np.repeat(2 * (w1 >> 28) + 1, 2, axis=-1)
        return {"d": _f16(b, 0), "q": (grid * signs).reshape(*lead, 256), "sc": sc}
    if qtype == T.IQ2_XS:
        q2 = _words(b, 2, 32, "<u2")
        grid = _INT["2xs"][q2 & 511]
        signs = _bits(KSIGNS_IQ2XS[q2 >> 9].astype(i64))
        sc = _nibble_scales(b[..., 66:74].astype(i64))
        return {"d": _f16(b, 0), "q": (grid * signs).reshape(*lead, 256), "sc": sc}
    qs, sg = b[..., 2:34].astype(i64), b[..., 34:66].astype(i64)
    qh = np.repeat(b[..., 66:74].astype(i64), 4, axis=-1)  # the high bits of group e in qh[e // 4]
    idx = qs | (((qh >> (2 * (np.arange(32) % 4))) & 3) << 8)
    grid = _INT["2s"][idx]
    sc = _nibble_scales(b[..., 74:82].astype(i64))
    return {"d": _f16(b, 0), "q": (grid * _bits(sg)).reshape(*lead, 256), "sc": sc}


def _decode_iq3(qtype: T, b: np.ndarray) -> dict[str, np.ndarray]:
    lead = b.shape[:-1]
    qs = b[..., 2:66].astype(i64)
    if qtype == T.IQ3_XXS:
        w = _words(b, 66, 8, "<u4")
        grid = _INT["3xxs"][qs].reshape(*lead, 8, 4, 8)  # [.., ib32, l, 8]
        signs = _bits(KSIGNS_IQ2XS[(w[..., None] >> (7 * np.arange(4))) & 127].astype(i64))
        sc = np.repeat(2 * (w >> 28) + 1, 2, axis=-1)
        return {"d": _f16(b, 0), "q": (grid * signs).reshape(*lead, 256), "sc": sc}
    qh = np.repeat(b[..., 66:74].astype(i64), 8, axis=-1)
    idx = qs | (((qh >> (np.arange(64) % 8)) & 1) << 8)
    grid = _INT["3s"][idx].reshape(*lead, 256)
    signs = _bits(b[..., 74:106].astype(i64)).reshape(*lead, 256)
    sc = np.repeat(_nibble_scales(b[..., 106:110].astype(i64)), 2, axis=-1)
    return {"d": _f16(b, 0), "q": grid * signs, "sc": sc}


def _decode_iq1(qtype: T, b: np.ndarray) -> dict[str, np.ndarray]:
    """IQ1_S / IQ1_M: ``q`` the grid values (-1, 0, 1), ``delta`` the sign (+-1) of each 8 values' delta."""
    lead = b.shape[:-1]
    if qtype == T.IQ1_S:
        qs = b[..., 2:34].astype(i64).reshape(*lead, 8, 4)
        qh = _words(b, 34, 8, "<u2")
        idx = qs | (((qh[..., None] >> (3 * np.arange(4))) & 7) << 8)
        delta = np.repeat(np.where(qh & 0x8000, -1, 1), 4, axis=-1)
        sc = np.repeat(2 * ((qh >> 12) & 7) + 1, 2, axis=-1)
        return {"d": _f16(b, 0), "q": _INT["1s"][idx].reshape(*lead, 256), "sc": sc, "delta": delta}
    qs = b[..., 0:32].astype(i64)
    nib = (np.repeat(b[..., 32:48].astype(i64), 2, axis=-1) >> (4 * (np.arange(32) % 2))) & 15
    sw = _words(b, 48, 4, "<u2")
    bits = (
        (sw[..., 0] >> 12)
        | ((sw[..., 1] >> 8) & 0x00F0)
        | ((sw[..., 2] >> 4) & 0x0F00)
        | (sw[..., 3] & 0xF000)
    )
    d = bits.astype(np.uint16).view(np.float16).astype(f32)
    sc = 2 * ((np.repeat(sw, 4, axis=-1) >> (3 * (np.arange(16) % 4))) & 7) + 1
    q = _INT["1s"][qs | ((nib & 7) << 8)].reshape(*lead, 256)
    return {"d": d, "q": q, "sc": sc, "delta": np.where(nib & 8, -1, 1)}


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half: 2**(e - 128) as f32, from its bits as ggml builds them."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23))
    return bits.astype(np.uint32).view(f32)


def decode(raw: np.ndarray, qtype: T | int, rows: int, cols: int) -> dict[str, np.ndarray]:
    """The integers ggml's vec_dot uses: ``q`` int64 [rows, nb, block], ``d`` f32 [rows, nb]; 256-value
    types also ``sc`` int64 [rows, nb, 16] (the integer scale of each 16 values; IQ4_XS: [rows, nb, 8], the
    signed scale ``ls - 32`` of each 32; ternary types: none), IQ1_S / IQ1_M ``delta`` [rows, nb, 32]."""
    qtype = T(qtype)
    block, nbytes = BLOCKS[qtype]
    b = np.asarray(raw).reshape(-1).view(np.uint8).reshape(rows, cols // block, nbytes)
    if qtype == T.IQ4_NL:
        return {"d": _f16(b, 0), "q": _iq4(b[..., :18], 2, KVALUES_IQ4NL)}
    if qtype == T.MXFP4:
        return {"d": e8m0_half(b[..., 0]), "q": _iq4(b, 1, KVALUES_MXFP4)}
    if qtype == T.IQ4_XS:
        sh = _words(b, 2, 1, "<u2")
        lo = (np.repeat(b[..., 4:8].astype(i64), 2, axis=-1) >> (4 * (np.arange(8) % 2))) & 15
        ls = lo | (((sh >> (2 * np.arange(8))) & 3) << 4)
        return {"d": _f16(b, 0), "q": _iq4(b, 8, KVALUES_IQ4NL), "sc": ls - 32}
    if qtype in (T.TQ1_0, T.TQ2_0):
        return _decode_ternary(qtype, b)
    if qtype in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S):
        return _decode_iq2(qtype, b)
    if qtype in (T.IQ3_XXS, T.IQ3_S):
        return _decode_iq3(qtype, b)
    return _decode_iq1(qtype, b)


def matmul_k(qtype: T, wd: dict[str, np.ndarray], xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """sumf [n, rows] of a 256-value type here: ``wd`` its ``decode``, ``xq`` int64 [n, nb, 256] and
    ``xd`` f32 [n, nb] the Q8_K activations."""
    q, d = wd["q"], wd["d"]
    n, nb = xd.shape
    rows = q.shape[0]
    g = 32 if qtype == T.IQ4_XS else 16
    # exact integer sums of each g values: [n, rows, nb, 256 / g]
    part = np.einsum("tsgj,rsgj->trsg", xq.reshape(n, nb, -1, g), q.reshape(rows, nb, -1, g))
    sumf = np.zeros((n, rows), f32)
    for s in range(nb):
        dy = xd[:, s, None]
        dw = d[None, :, s]
        if qtype == T.IQ4_XS:  # d1 = d4d8 * (ls - 32); sumf += d1 * sumi, per 32 values
            d4d8 = dw * dy
            for ib in range(8):
                d1 = d4d8 * wd["sc"][None, :, s, ib].astype(f32)
                sumf = sumf + d1 * part[:, :, s, ib].astype(f32)
        elif qtype == T.TQ1_0:
            sumf = sumf + part[:, :, s].sum(-1).astype(f32) * (dw * dy)
        elif qtype == T.TQ2_0:
            sumf = sumf + part[:, :, s].sum(-1).astype(f32) * (dy * dw)
        elif qtype in (T.IQ1_S, T.IQ1_M):  # (d * y.d) * (sumi + DELTA * sumi1)
            sumi = (part[:, :, s] * wd["sc"][None, :, s]).sum(-1)
            x8 = xq[:, s].reshape(n, 32, 8).sum(-1)  # [n, 32]: the activations' sum of each 8
            t = wd["delta"][:, s] * np.repeat(wd["sc"][:, s], 2, axis=-1)  # [rows, 32]
            sumi1 = np.einsum("tg,rg->tr", x8, t)
            sumf = sumf + (dw * dy) * (sumi.astype(f32) + _IQ1_DELTA * sumi1.astype(f32))
        else:  # the grid types: bsum = sum of ls * sumi; sumf += d * bsum
            bsum = (part[:, :, s] * wd["sc"][None, :, s]).sum(-1)
            sumf = sumf + (dw * dy) * bsum.astype(f32)
    factor = GRID_TYPES.get(qtype)
    return sumf if factor is None or factor == 1.0 else f32(factor) * sumf
