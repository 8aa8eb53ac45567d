"""Numpy versions of the scalar helpers in ``llama_quant.formats.common``, vectorized over blocks."""

from __future__ import annotations

import numpy as np

__all__ = ["f16_bits", "f16_to_f32", "nearest_int", "roundf"]

_f = np.float32


def f16_bits(v: np.ndarray) -> np.ndarray:
    """float32 -> fp16 bits as ggml_compute_fp32_to_fp16 (round to nearest even, NaN -> 0x7E00 | sign)."""
    v = np.asarray(v, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = v.astype(np.float16).view(np.uint16)
    nan = np.isnan(v)
    if nan.any():
        sign = (v.view(np.uint32) >> np.uint32(16)).astype(np.uint16) & np.uint16(0x8000)
        h = np.where(nan, sign | np.uint16(0x7E00), h)
    return h


def f16_to_f32(h: np.ndarray) -> np.ndarray:
    return np.asarray(h, dtype=np.uint16).view(np.float16).astype(np.float32)


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: add 1.5 * 2**23 in float32 and read the mantissa bits (int64 result)."""
    val = (np.asarray(v, dtype=np.float32) + _f(12582912.0)).astype(np.float32)
    return (val.view(np.uint32) & np.uint32(0x007FFFFF)).astype(np.int64) - 0x00400000


def roundf(v: np.ndarray) -> np.ndarray:
    """C roundf (half away from zero), float32."""
    v = np.asarray(v, dtype=np.float32)
    t = np.trunc(v)
    return np.where(np.abs(v - t) >= _f(0.5), t + np.sign(v), t).astype(np.float32)


# ---- scale searches of ggml-quants.c, vectorized over blocks: x is [nblocks, n] float32 ----

_EPS = _f(1e-15)


def _seq_sum(terms) -> np.ndarray:
    """Sum float32 column vectors one after the other (the C loop's order)."""
    acc: np.ndarray | None = None
    for t in terms:
        acc = t.astype(np.float32) if acc is None else (acc + t).astype(np.float32)
    assert acc is not None
    return acc


def row_sigma2(x: np.ndarray, scale_num: float = 1.0) -> np.ndarray:
    """scale_num * sum(x^2) / n per row of x [rows, n], summed sequentially in float32."""
    s = np.zeros(x.shape[0], np.float32)
    for j in range(x.shape[1]):
        s += x[:, j] * x[:, j]
    if scale_num != 1.0:
        s = (_f(scale_num) * s).astype(np.float32)
    return (s / _f(x.shape[1])).astype(np.float32)


def signed_absmax(x: np.ndarray) -> np.ndarray:
    """Per row, the first value of largest magnitude (0 when all are 0)."""
    idx = np.argmax(np.abs(x), axis=1)
    v = x[np.arange(x.shape[0]), idx].astype(np.float32)
    return np.where(v == 0, _f(0), v).astype(np.float32)


def make_qx_quants(x: np.ndarray, nmax: int, qw: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(scale [nb], L [nb, n] in [0, 2*nmax)) as ggml's make_qx_quants with rmse_type 1."""
    _nb, n = x.shape
    w = qw if qw is not None else (x * x).astype(np.float32)
    fmax = signed_absmax(x)
    zero = np.abs(fmax) < _EPS
    with np.errstate(all="ignore"):
        fm = np.where(zero, _f(1), fmax).astype(np.float32)
        iscale = (_f(-nmax) / fm).astype(np.float32)

        def trial(isc):
            li = np.clip(nearest_int(isc[:, None] * x), -nmax, nmax - 1)
            fl = li.astype(np.float32)
            sumlx = _seq_sum(w[:, i] * x[:, i] * fl[:, i] for i in range(n))
            suml2 = _seq_sum(w[:, i] * fl[:, i] * fl[:, i] for i in range(n))
            return li, sumlx, suml2

        li, sumlx, suml2 = trial(iscale)
        L = li + nmax
        scale = np.where(suml2 != 0, sumlx / suml2, _f(0)).astype(np.float32)
        best = (scale * sumlx).astype(np.float32)
        for step in range(-9, 10):
            if step == 0:
                continue
            isc = (-(_f(nmax) + _f(0.1) * _f(step)) / fm).astype(np.float32)
            li, sumlx, suml2 = trial(isc)
            upd = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            L = np.where(upd[:, None], li + nmax, L)
            scale = np.where(upd, sumlx / suml2, scale).astype(np.float32)
            best = np.where(upd, scale * sumlx, best).astype(np.float32)
    L = np.where(zero[:, None], 0, L).astype(np.int8)
    return np.where(zero, _f(0), scale).astype(np.float32), L


def make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """(scale, L in [0, 2*nmax)) as ggml's make_q3_quants with do_rmse=true."""
    nb, n = x.shape
    w = (x * x).astype(np.float32)
    fmax = signed_absmax(x)
    zero = np.abs(fmax) < _EPS
    with np.errstate(all="ignore"):
        fm = np.where(zero, _f(1), fmax).astype(np.float32)
        iscale = (_f(-nmax) / fm).astype(np.float32)
        L = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        fl = L.astype(np.float32)
        sumlx = _seq_sum(w[:, i] * x[:, i] * fl[:, i] for i in range(n))
        suml2 = _seq_sum(w[:, i] * fl[:, i] * fl[:, i] for i in range(n))
        active = np.ones(nb, bool)
        for _itry in range(5):
            n_changed = np.zeros(nb, np.int64)
            for i in range(n):
                fli = L[:, i].astype(np.float32)
                wx = (w[:, i] * x[:, i]).astype(np.float32)
                slx = (sumlx - wx * fli).astype(np.float32)
                sl2 = (suml2 - w[:, i] * fli * fli).astype(np.float32)
                new_l = np.clip(nearest_int(x[:, i] * sl2 / slx), -nmax, nmax - 1)
                cond = active & (slx > 0) & (new_l != L[:, i])
                fnl = new_l.astype(np.float32)
                slx = (slx + wx * fnl).astype(np.float32)
                sl2 = (sl2 + w[:, i] * fnl * fnl).astype(np.float32)
                acc = cond & (sl2 > 0) & (slx * slx * suml2 > sumlx * sumlx * sl2)
                L[:, i] = np.where(acc, new_l, L[:, i])
                sumlx = np.where(acc, slx, sumlx)
                suml2 = np.where(acc, sl2, suml2)
                n_changed += acc
            active &= n_changed > 0
            if not active.any():
                break
        scale = np.where(suml2 > 0, sumlx / suml2, _f(0)).astype(np.float32)
    L = np.where(zero[:, None], 0, L + nmax).astype(np.int8)
    return np.where(zero, _f(0), scale).astype(np.float32), L


def make_qkx_quants(
    x: np.ndarray,
    w: np.ndarray,
    nmax: int,
    rmin: float,
    rdelta: float,
    nstep: int,
    use_mad: bool,
    strict: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale, the_min, L in [0, nmax]) as make_qkx2_quants (strict: max == min guard) or make_qkx3_quants."""
    nb, n = x.shape
    fmin = x[:, 0].copy()
    fmax = x[:, 0].copy()
    sum_w = w[:, 0].copy()
    sum_x = (sum_w * x[:, 0]).astype(np.float32)
    for i in range(1, n):
        fmin = np.where(x[:, i] < fmin, x[:, i], fmin)
        fmax = np.where(x[:, i] > fmax, x[:, i], fmax)
        sum_w = (sum_w + w[:, i]).astype(np.float32)
        sum_x = (sum_x + w[:, i] * x[:, i]).astype(np.float32)
    fmin = np.where(fmin > 0, _f(0), fmin).astype(np.float32)
    degenerate = (fmax == fmin) if strict else (fmax <= fmin)
    fmin0 = fmin.copy()

    def err(scale, mn, L):
        e = np.zeros(nb, np.float32)
        for i in range(n):
            diff = (scale * L[:, i].astype(np.float32) + mn - x[:, i]).astype(np.float32)
            diff = np.abs(diff) if use_mad else diff * diff
            e += w[:, i] * diff
        return e

    with np.errstate(all="ignore"):
        rng = (fmax - fmin).astype(np.float32)
        iscale = (_f(nmax) / rng).astype(np.float32)
        scale = (_f(1) / iscale).astype(np.float32)
        L = np.clip(nearest_int(iscale[:, None] * (x - fmin[:, None])), 0, nmax)
        best = err(scale, fmin, L)
        for step in range(nstep + 1) if nstep >= 1 else ():
            # max - min with the current (possibly updated) min, as in the C loop
            isc = ((_f(rmin) + _f(rdelta) * _f(step) + _f(nmax)) / (fmax - fmin)).astype(np.float32)
            La = np.clip(nearest_int(isc[:, None] * (x - fmin[:, None])), 0, nmax)
            fl = La.astype(np.float32)
            sum_l = _seq_sum(w[:, i] * fl[:, i] for i in range(n))
            sum_l2 = _seq_sum(w[:, i] * fl[:, i] * fl[:, i] for i in range(n))
            sum_xl = _seq_sum(w[:, i] * fl[:, i] * x[:, i] for i in range(n))
            D = (sum_w * sum_l2 - sum_l * sum_l).astype(np.float32)
            this_scale = ((sum_w * sum_xl - sum_x * sum_l) / D).astype(np.float32)
            this_min = ((sum_l2 * sum_x - sum_l * sum_xl) / D).astype(np.float32)
            clamp = this_min > 0
            this_min = np.where(clamp, _f(0), this_min).astype(np.float32)
            this_scale = np.where(clamp, sum_xl / sum_l2, this_scale).astype(np.float32)
            cur = err(this_scale, this_min, La)
            upd = (D > 0) & (cur < best)
            L = np.where(upd[:, None], La, L)
            best = np.where(upd, cur, best)
            scale = np.where(upd, this_scale, scale).astype(np.float32)
            fmin = np.where(upd, this_min, fmin).astype(np.float32)
    L = np.where(degenerate[:, None], 0, L).astype(np.uint8)
    scale = np.where(degenerate, _f(0), scale).astype(np.float32)
    fmin = np.where(degenerate, fmin0, fmin).astype(np.float32)
    return scale, (-fmin).astype(np.float32), L


def make_qp_quants(x: np.ndarray, nmax: int, qw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale, L in [0, nmax]) as ggml's make_qp_quants for non-negative x."""
    nb, n = x.shape
    fmax = np.zeros(nb, np.float32)
    for i in range(n):
        fmax = np.where(fmax > x[:, i], fmax, x[:, i]).astype(np.float32)
    zero = fmax < _EPS
    with np.errstate(all="ignore"):
        fm = np.where(zero, _f(1), fmax).astype(np.float32)
        iscale = (_f(nmax) / fm).astype(np.float32)
        L = nearest_int(iscale[:, None] * x) & 0xFF
        scale = (_f(1) / iscale).astype(np.float32)
        best = np.zeros(nb, np.float32)
        for i in range(n):
            diff = (x[:, i] - scale * L[:, i].astype(np.float32)).astype(np.float32)
            best += qw[:, i] * diff * diff
        for step in range(-4, 5):
            if step == 0:
                continue
            isc = ((_f(0.1) * _f(step) + _f(nmax)) / fm).astype(np.float32)
            sc = (_f(1) / isc).astype(np.float32)
            mse = np.zeros(nb, np.float32)
            for i in range(n):
                li = np.minimum(nmax, nearest_int(isc * x[:, i]))
                diff = (x[:, i] - sc * li.astype(np.float32)).astype(np.float32)
                mse += qw[:, i] * diff * diff
            upd = mse < best
            best = np.where(upd, mse, best)
            iscale = np.where(upd, isc, iscale).astype(np.float32)
        L = np.minimum(nmax, nearest_int(iscale[:, None] * x)) & 0xFF
        fl = L.astype(np.float32)
        sumlx = _seq_sum(qw[:, i] * x[:, i] * fl[:, i] for i in range(n))
        suml2 = _seq_sum(qw[:, i] * fl[:, i] * fl[:, i] for i in range(n))
        active = np.ones(nb, bool)
        for _itry in range(5):
            n_changed = np.zeros(nb, np.int64)
            for i in range(n):
                w = qw[:, i]
                fli = L[:, i].astype(np.float32)
                slx = (sumlx - w * x[:, i] * fli).astype(np.float32)
                sl2 = (suml2 - w * fli * fli).astype(np.float32)
                new_l = np.minimum(nmax, nearest_int(x[:, i] * sl2 / slx))
                cond = active & (slx > 0) & (sl2 > 0) & (new_l != L[:, i])
                fnl = new_l.astype(np.float32)
                slx = (slx + w * x[:, i] * fnl).astype(np.float32)
                sl2 = (sl2 + w * fnl * fnl).astype(np.float32)
                acc = cond & (slx * slx * suml2 > sumlx * sumlx * sl2)
                L[:, i] = np.where(acc, new_l & 0xFF, L[:, i])
                sumlx = np.where(acc, slx, sumlx)
                suml2 = np.where(acc, sl2, suml2)
                n_changed += acc
            active &= n_changed > 0
            if not active.any():
                break
        scale = np.where(suml2 > 0, sumlx / suml2, _f(0)).astype(np.float32)
    return np.where(zero, _f(0), scale).astype(np.float32), np.where(zero[:, None], 0, L).astype(np.uint8)
