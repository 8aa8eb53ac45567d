"""llama-perplexity's KL-divergence mode: the base model's log-probabilities file (``--kl-divergence-base``)
and the comparison of another model against it (``--kl-divergence``), in llama.cpp's file format and figures.

The file: ``_logits_``, int32 n_ctx, int32 n_vocab, int32 n_chunk, the n_chunk * n_ctx int32 tokens
evaluated, then per chunk and scored position (``n_ctx - 1 - n_ctx/2`` of them) a row of
``2 * ((n_vocab + 1) / 2) + 4`` uint16: float32 scale, float32 min_log_prob, then each token's log-probability
as ``min_log_prob + scale * q`` (q = 0 for anything below max - 16). The kernels below follow llama.cpp's
float/double mix operation by operation, so equal logits give an equal file and equal figures.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import BinaryIO

import numba
import numpy as np

__all__ = [
    "MAGIC",
    "BaseFile",
    "BaseWriter",
    "KldError",
    "KldStats",
    "compare_rows",
    "encode_rows",
    "row_width",
]

MAGIC = b"_logits_"
_F32 = np.float32


class KldError(Exception):
    """A base file that cannot be used; the message is llama.cpp's."""


def row_width(n_vocab: int) -> int:
    """uint16 values per scored position: two float32 header words, then the vocabulary, padded to even."""
    return 2 * ((n_vocab + 1) // 2) + 4


@numba.njit(cache=True)
def _nearest_int(f: np.float32) -> int:
    # llama.cpp's nearest_int: round to nearest even through the float32 sum with 1.5 * 2^23
    return int(f + _F32(12582912.0)) - 12582912


@numba.njit(cache=True)
def encode_rows(logits: np.ndarray, targets: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Each logits row [n, n_vocab] as a base-file row of ``out`` [n, row_width]; returns -log p(target)."""
    n, n_vocab = logits.shape
    nll = np.empty(n, np.float64)
    for r in range(n):
        x = logits[r]
        mx = x[0]
        mn = x[0]
        for i in range(1, n_vocab):
            mx = max(mx, x[i])
            mn = min(mn, x[i])
        mn = max(mn, mx - _F32(16.0))
        sum_exp = 0.0
        for i in range(n_vocab):
            sum_exp += math.exp(x[i] - mx)
        lse = _F32(math.log(sum_exp))
        min_log_prob = mn - mx - lse
        scale = (mx - mn) / _F32(65535.0)
        row = out[r]
        row[:] = 0
        head = np.empty(2, np.float32)
        head[0] = scale
        head[1] = min_log_prob
        row[:4] = head.view(np.uint16)
        if scale != 0:
            inv = _F32(1.0) / scale
            for i in range(n_vocab):
                if x[i] > mn:
                    row[4 + i] = _nearest_int(inv * (x[i] - mn))
        nll[r] = mx + lse - x[targets[r]]
    return nll


@numba.njit(cache=True)
def compare_rows(
    logits: np.ndarray, base: np.ndarray, targets: np.ndarray, sums: np.ndarray, counts: np.ndarray,
    kld_out: np.ndarray, p_diff_out: np.ndarray,
) -> None:  # fmt: skip
    """Logits rows against base-file rows: adds to ``sums`` (nll, nll², nll_base, nll_base², nll·nll_base,
    kld, kld², Δp, Δp², Δp⁴, max |Δp|) and ``counts`` (same top token, rows); per-row KLD and Δp out."""
    n, n_vocab = logits.shape
    for r in range(n):
        x = logits[r]
        mx = x[0]
        imax = 0
        for i in range(1, n_vocab):
            if x[i] > mx:
                mx = x[i]
                imax = i
        sum_exp = 0.0
        for i in range(n_vocab):
            sum_exp += math.exp(x[i] - mx)
        lse = _F32(math.log(sum_exp))
        head = base[r, :4].copy().view(np.float32)
        scale, min_log_prob = head[0], head[1]
        q = base[r, 4:]
        tok = targets[r]
        nll = mx + lse - x[tok]
        sums[0] += nll
        sums[1] += nll * nll
        nll_base = -(scale * _F32(q[tok]) + min_log_prob)
        sums[2] += nll_base
        sums[3] += nll_base * nll_base
        sums[4] += nll * nll_base
        mx += lse
        kld = 0.0
        imax_base = -1
        p_max = _F32(0.0)
        for i in range(n_vocab):
            p_log_base = scale * _F32(q[i]) + min_log_prob
            if i == 0 or p_log_base > p_max:
                p_max = p_log_base
                imax_base = i
            if p_log_base > -16.0:
                kld += math.exp(p_log_base) * (p_log_base - x[i] + mx)
        sums[5] += kld
        sums[6] += kld * kld
        counts[1] += 1
        if imax == imax_base:
            counts[0] += 1
        p_diff = math.exp(-nll) - math.exp(-nll_base)
        sums[7] += p_diff
        p_diff2 = np.float64(p_diff * p_diff)
        sums[8] += p_diff2
        sums[9] += p_diff2 * p_diff2
        sums[10] = max(sums[10], np.float64(abs(p_diff)))
        kld_out[r] = kld
        p_diff_out[r] = p_diff


@dataclass(slots=True)
class BaseFile:
    """An open base file, header read; ``rows(n)`` reads the next chunk's rows."""

    path: str
    fh: BinaryIO
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray

    @classmethod
    def open(cls, path: str, n_ctx_max: int, n_vocab: int) -> BaseFile:
        """Read the header; raise KldError with llama.cpp's message for a file that does not fit."""
        try:
            fh: BinaryIO = open(path, "rb")  # noqa: SIM115 (kept open for the chunks)
        except OSError:
            raise KldError(f"kl_divergence: failed to open {path}") from None
        try:
            return cls._header(path, fh, n_ctx_max, n_vocab)
        except BaseException:
            fh.close()
            raise

    @classmethod
    def _header(cls, path: str, fh: BinaryIO, n_ctx_max: int, n_vocab: int) -> BaseFile:
        if fh.read(8) != MAGIC:
            raise KldError(f"kl_divergence: {path} does not look like a file containing log-probabilities")
        head = fh.read(12)
        if len(head) < 12:
            raise KldError(f"kl_divergence: failed reading n_vocab, n_chunk from {path}")
        n_ctx, nv, n_chunk = struct.unpack("<Iii", head)
        if n_ctx > n_ctx_max:
            raise KldError(
                f"kl_divergence: {path} has been computed with {n_ctx}, while the current context is "
                f"{n_ctx_max}. Increase it with -c and retry"
            )
        if nv != n_vocab:
            raise KldError(f"kl_divergence: inconsistent vocabulary ({nv} vs {n_vocab})")
        if n_ctx < 2 or n_chunk < 1:
            raise KldError(f"kl_divergence: failed reading evaluation tokens from {path}")
        tokens = np.frombuffer(fh.read(4 * n_ctx * n_chunk), np.int32)
        if len(tokens) < n_ctx * n_chunk or tokens.min() < 0 or tokens.max() >= n_vocab:
            raise KldError(f"kl_divergence: failed reading evaluation tokens from {path}")
        return cls(path, fh, n_ctx, nv, n_chunk, tokens)

    def rows(self, chunk: int) -> np.ndarray:
        """The next chunk's rows [n_ctx - 1 - n_ctx/2, row_width] (``chunk``: its index, for the error)."""
        n, w = self.n_ctx - 1 - self.n_ctx // 2, row_width(self.n_vocab)
        raw = self.fh.read(2 * n * w)
        if len(raw) < 2 * n * w:
            raise KldError(f"kl_divergence: failed reading log-probs for chunk {chunk}")
        return np.frombuffer(raw, np.uint16).reshape(n, w)

    def close(self) -> None:
        """Close the file."""
        self.fh.close()


class BaseWriter:
    """Writes a base file as llama-perplexity's ``--kl-divergence-base`` does while it scores the text."""

    def __init__(self, path: str, n_ctx: int) -> None:
        self.fh: BinaryIO = open(path, "wb")  # noqa: SIM115 (written chunk by chunk)
        self.fh.write(MAGIC + struct.pack("<i", n_ctx))
        self.rows = np.zeros((0, 0), np.uint16)

    def begin(self, n_vocab: int, n_chunk: int, tokens: np.ndarray) -> None:
        """The vocabulary size, chunk count and the evaluated tokens (n_chunk * n_ctx of them)."""
        self.fh.write(struct.pack("<ii", n_vocab, n_chunk) + np.asarray(tokens, "<i4").tobytes())
        self.n_vocab = n_vocab

    def add(self, logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """One chunk's scored rows; returns -log p(target) per row (llama.cpp's figures for the PPL)."""
        n = len(logits)
        if self.rows.shape != (n, row_width(self.n_vocab)):
            self.rows = np.zeros((n, row_width(self.n_vocab)), np.uint16)
        nll = encode_rows(np.ascontiguousarray(logits, np.float32), targets.astype(np.int64), self.rows)
        self.fh.write(self.rows.tobytes())
        return nll

    def close(self) -> None:
        """Close the file."""
        self.fh.close()


def _mean_unc(s: float, s2: float, count: int) -> tuple[float, float]:
    if count < 1:
        return 0.0, 0.0
    f = s / count
    df = s2 / count - f * f
    return f, (math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0)


def _cov(a: float, b: float, ab: float, count: int) -> float:
    return 0.0 if count < 10 else (ab / count - (a / count) * (b / count)) / (count - 1)


def _div(a: float, b: float) -> float:
    # C's division: inf or nan instead of an exception
    with np.errstate(all="ignore"):
        return float(np.float64(a) / np.float64(b))


def _sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 else math.nan


def _percentile(v: np.ndarray, fraction: float) -> float:
    # in float32, as llama.cpp's lambda
    if fraction <= 0:
        return float(v[0])
    if fraction >= 1:
        return float(v[-1])
    p = _F32(fraction) * _F32(len(v) - 1)
    ip = int(p)
    p = _F32(p - _F32(ip))
    return float((_F32(1) - p) * v[ip] + p * v[min(ip + 1, len(v) - 1)])


def _median(v: np.ndarray) -> float:
    n = len(v)
    return float(_F32(0.5) * (v[n // 2] + v[n // 2 - 1])) if n % 2 == 0 else float(v[n // 2])


@dataclass
class KldStats:
    """The running sums of a comparison and the per-position values, with llama.cpp's report lines."""

    sums: np.ndarray = field(default_factory=lambda: np.zeros(11, np.float64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(2, np.int64))
    kld: list[np.ndarray] = field(default_factory=list)
    p_diff: list[np.ndarray] = field(default_factory=list)

    def add(self, logits: np.ndarray, base: np.ndarray, targets: np.ndarray) -> None:
        """One chunk: its scored logits rows, the base file's rows and the target tokens."""
        n = len(base)
        k, p = np.empty(n, np.float32), np.empty(n, np.float32)
        x = np.ascontiguousarray(logits[:n], np.float32)
        compare_rows(x, base, targets.astype(np.int64), self.sums, self.counts, k, p)
        self.kld.append(k)
        self.p_diff.append(p)

    @property
    def count(self) -> int:
        """Positions compared."""
        return int(self.counts[1])

    def _figures(self) -> dict[str, tuple[float, float]]:
        s, n = self.sums, self.count
        lp, lb = _mean_unc(s[0], s[1], n), _mean_unc(s[2], s[3], n)
        cov = _cov(s[0], s[2], s[4], n)
        ratio = (lp[0] - lb[0], _sqrt(lp[1] ** 2 + lb[1] ** 2 - 2.0 * cov))
        mse = _mean_unc(s[8], s[9], n)
        rms = math.sqrt(mse[0])
        top = self.counts[0] / n if n else 0.0
        return {
            "ppl": (math.exp(lp[0]), math.exp(lp[0]) * lp[1]),
            "base": (math.exp(lb[0]), math.exp(lb[0]) * lb[1]),
            "ratio": ratio,
            "cov": (cov, _div(cov, lp[1] * lb[1])),
            "kld": _mean_unc(s[5], s[6], n),
            "rms": (rms, _div(0.5, rms) * mse[1]),
            "top": (top, _sqrt(_div(top * (1 - top), n - 1))),
            "p_diff": _mean_unc(s[7], s[8], n),
        }

    def chunk_line(self, chunk: int) -> str:
        """The per-chunk table row after ``chunk`` (1-based)."""
        f = self._figures()
        (p, pu), (r, ru), (k, ku) = f["ppl"], f["ratio"], f["kld"]
        (rms, rmsu), (t, tu) = f["rms"], f["top"]
        return (
            f"{chunk:4d}    {p:9.4f} ± {pu:9.4f}    {r:10.5f} ± {ru:10.5f}    {k:10.5f} ± {ku:10.5f}"
            f"    {100 * rms:6.3f} ± {100 * rmsu:6.3f} %    {100 * t:6.3f} ± {100 * tu:6.3f} %"
        )

    def report(self) -> list[str]:
        """The closing statistics (none under 100 positions, as llama.cpp)."""
        if self.count < 100:
            return []
        f = self._figures()
        kld, pd = np.sort(np.concatenate(self.kld)), np.sort(np.concatenate(self.p_diff))
        (p, pu), (b, bu), (r, ru), (cov, cor) = f["ppl"], f["base"], f["ratio"], f["cov"]
        pr = math.exp(r)
        d_unc = _sqrt(pu * pu + bu * bu - 2.0 * p * b * cov)
        lines = [
            "====== Perplexity statistics ======",
            f"Mean PPL(Q)                   : {p:10.6f} ± {pu:10.6f}",
            f"Mean PPL(base)                : {b:10.6f} ± {bu:10.6f}",
            f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * cor:6.2f}%",
            f"Mean ln(PPL(Q)/PPL(base))     : {r:10.6f} ± {ru:10.6f}",
            f"Mean PPL(Q)/PPL(base)         : {pr:10.6f} ± {pr * ru:10.6f}",
            f"Mean PPL(Q)-PPL(base)         : {p - b:10.6f} ± {d_unc:10.6f}",
            "",
            "====== KL divergence statistics ======",
            "Mean    KLD: {:10.6f} ± {:10.6f}".format(*f["kld"]),
            f"Maximum KLD: {float(kld[-1]):10.6f}",
        ]
        marks = [(0.999, "99.9%  "), (0.99, "99.0%  "), (0.95, "95.0%  "), (0.9, "90.0%  ")]
        lows = [(0.1, "10.0%  "), (0.05, " 5.0%  "), (0.01, " 1.0%  "), (0.001, " 0.1%  ")]
        lines += [f"{name} KLD: {_percentile(kld, q):10.6f}" for q, name in marks]
        lines.append(f"Median  KLD: {_median(kld):10.6f}")
        lines += [f"{name} KLD: {_percentile(kld, q):10.6f}" for q, name in lows]
        lines += [f"Minimum KLD: {float(kld[0]):10.6f}", "", "====== Token probability statistics ======"]
        lines.append("Mean    Δp: {:6.3f} ± {:5.3f} %".format(*(100 * v for v in f["p_diff"])))
        lines.append(f"Maximum Δp: {100 * float(pd[-1]):6.3f}%")
        for q, name in [*marks, (0.75, "75.0%  ")]:
            lines.append(f"{name} Δp: {100 * _percentile(pd, q):6.3f}%")
        lines.append(f"Median  Δp: {100 * _median(pd):6.3f}%")
        for q, name in [(0.25, "25.0%  "), *lows]:
            lines.append(f"{name} Δp: {100 * _percentile(pd, q):6.3f}%")
        lines.append(f"Minimum Δp: {100 * float(pd[0]):6.3f}%")
        lines.append("RMS Δp    : {:6.3f} ± {:5.3f} %".format(*(100 * v for v in f["rms"])))
        lines.append("Same top p: {:6.3f} ± {:5.3f} %".format(*(100 * v for v in f["top"])))
        return lines
