"""Writing importance matrices as llama-imatrix does, and reading them back raw for merging.

``imatrix.load_imatrix`` gives the quantizer its normalised vectors; this module holds the raw
accumulators (sums of squared activations, sums of activations, row counts per expert) that
``llama-imatrix`` collects, merges (``--in-file``) and saves: the GGUF format (``W.in_sum2``, ``W.counts``,
``W.in_sum``, ``W.stats``) and the legacy ``.dat`` format.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field

import numpy as np

import gguf_io
from gguf_io import GGMLQuantizationType, GGUFError, GGUFValueType, GGUFWriter

__all__ = ["STATS_SCHEMA", "ImatrixData", "ImatrixEntry", "load_raw", "save_dat", "save_gguf", "vector_stats"]

STATS_SCHEMA = (
    "sum_sq",
    "mean",
    "elements",
    "std_deviation",
    "skewness",
    "kurtosis",
    "gain",
    "h_norm",
    "l2_dist",
    "cossim",
    "pearson",
    "covariance",
)
_F32 = GGMLQuantizationType.F32
_BLK = re.compile(r"blk\.(\d+)\.")


@dataclass(slots=True)
class ImatrixEntry:
    """One weight's accumulators: ``sum2``/``sums`` float64 ``[n_mat, n_cols]``, ``counts`` int64 ``[n_mat]``;
    ``sums`` is None for data merged from a legacy file (which has no activation sums)."""

    sum2: np.ndarray
    counts: np.ndarray
    sums: np.ndarray | None

    @classmethod
    def empty(cls, n_cols: int, n_mat: int = 1) -> ImatrixEntry:
        z = np.zeros((n_mat, n_cols), np.float64)
        return cls(z, np.zeros(n_mat, np.int64), z.copy())


@dataclass(slots=True)
class ImatrixData:
    """Everything a file holds: entries by weight name, datasets, chunks processed and the chunk size."""

    entries: dict[str, ImatrixEntry] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0

    def merge(self, other: ImatrixData, chunk_size: int) -> None:
        """Add ``other`` (read by `load_raw`) into this one, as llama-imatrix's ``--in-file``."""
        if not self.chunk_size and other.chunk_size:
            self.chunk_size = other.chunk_size
        for name, e in other.entries.items():
            mine = self.entries.get(name)
            if mine is None:
                self.entries[name] = ImatrixEntry(e.sum2.copy(), e.counts.copy(), _copy(e.sums))
                continue
            if mine.sum2.size != e.sum2.size:
                raise GGUFError(f"mismatched sums size for {name}: {e.sum2.size} != {mine.sum2.size}")
            if len(mine.counts) == 1 and len(e.counts) > 1:
                mine.counts = np.full(len(e.counts), mine.counts[0], np.int64)
                mine.sum2 = mine.sum2.reshape(e.sum2.shape)
            mine.sum2 += e.sum2.reshape(mine.sum2.shape)
            mine.counts += e.counts
            if mine.sums is not None and e.sums is not None:
                mine.sums += e.sums.reshape(mine.sums.shape)
            else:
                mine.sums = None
        self.datasets.extend(other.datasets)
        size = self.chunk_size or chunk_size
        top = max((int(e.counts.max()) for e in self.entries.values() if e.counts.size), default=0)
        self.chunk_count = rows_to_chunks(top, size)


def rows_to_chunks(n_rows: int, chunk_size: int) -> int:
    """Rows counted -> chunks, rounded to nearest (llama-imatrix's chunk counter)."""
    return (n_rows + chunk_size // 2) // chunk_size if chunk_size > 0 else 0


def _copy(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else a.copy()


# -- reading ----------------------------------------------------------------------------------------------


def load_raw(path: str | os.PathLike[str], chunk_size: int) -> ImatrixData:
    """The raw accumulators of a GGUF or legacy imatrix file. A legacy file stores means times its call
    count, so its sums and counts are scaled back by ``chunk_size`` as llama-imatrix does."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise GGUFError(f"cannot read imatrix file {path!r}: {e.strerror}") from None
    return _raw_gguf(path) if magic == b"GGUF" else _raw_legacy(path, chunk_size)


def _raw_gguf(path: str) -> ImatrixData:
    with gguf_io.open(path) as f:
        md = f.metadata
        if "imatrix.chunk_count" not in md or "imatrix.chunk_size" not in md:
            raise GGUFError(f"missing imatrix metadata in file {path}")
        sets = md.get("imatrix.datasets", [])
        data = ImatrixData(
            {}, [str(d) for d in sets], int(md["imatrix.chunk_count"]), int(md["imatrix.chunk_size"])
        )
        for name in f.tensors:
            if not name.endswith(".in_sum2"):
                continue
            base = name[: -len(".in_sum2")]
            if base + ".counts" not in f.tensors:
                raise GGUFError(f"imatrix {path}: mismatched sums and counts for {base}")
            counts = f.tensor_bytes(base + ".counts").view(np.float32)
            n_mat = max(counts.size, 1)
            sum2 = f.tensor_bytes(name).view(np.float32).astype(np.float64).reshape(n_mat, -1)
            sums = None
            if base + ".in_sum" in f.tensors:
                sums = f.tensor_bytes(base + ".in_sum").view(np.float32).astype(np.float64).reshape(n_mat, -1)
            data.entries[base] = ImatrixEntry(sum2, np.rint(counts).astype(np.int64), sums)
    return data


def _raw_legacy(path: str, chunk_size: int) -> ImatrixData:
    with open(path, "rb") as fh:
        raw = fh.read()
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(raw):
            raise GGUFError(f"imatrix {path}: truncated legacy file")
        pos += n
        return raw[pos - n : pos]

    def i32() -> int:
        return struct.unpack("<i", take(4))[0]

    n_entries = i32()
    if n_entries < 1:
        raise GGUFError(f"no data in imatrix file {path}")
    data = ImatrixData()
    for _ in range(n_entries):
        name = take(i32()).split(b"\0", 1)[0].decode("utf-8", "replace")
        ncall, nval = i32(), i32()
        values = np.frombuffer(take(4 * nval), "<f4").astype(np.float32)
        # the values are means times ncall: times the chunk size, sums over ncall * chunk_size rows
        sum2 = (values.astype(np.float64) * chunk_size).reshape(1, -1)
        data.entries[name] = ImatrixEntry(sum2, np.array([ncall * chunk_size], np.int64), None)
    if pos + 4 <= len(raw):
        data.chunk_count = i32()
        if pos + 4 <= len(raw):
            n = i32()
            if n > 0 and pos + n <= len(raw):
                data.datasets.append(take(n).decode("utf-8", "replace"))
    return data


# -- writing ----------------------------------------------------------------------------------------------


def save_gguf(path: str, data: ImatrixData, n_layer_nextn: int = 0) -> None:
    """Write ``data`` as llama-imatrix's GGUF file (names sorted; ``W.stats`` per weight)."""
    stats = all_stats(data)
    w = GGUFWriter(path)
    w.add_metadata("general.type", "imatrix")
    w.add_metadata("imatrix.datasets", list(data.datasets), GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_metadata("imatrix.chunk_count", data.chunk_count, GGUFValueType.UINT32)
    w.add_metadata("imatrix.chunk_size", data.chunk_size, GGUFValueType.UINT32)
    if n_layer_nextn > 0:
        w.add_metadata("imatrix.n_layer_nextn", n_layer_nextn, GGUFValueType.UINT32)
    w.add_metadata("imatrix.stats_schema", list(STATS_SCHEMA), GGUFValueType.ARRAY, GGUFValueType.STRING)
    for name in sorted(data.entries):
        e = data.entries[name]
        n_mat, n_cols = e.sum2.shape
        if e.sum2.size and n_mat:
            w.add_tensor(f"{name}.in_sum2", [n_cols, n_mat], _F32, e.sum2.astype(np.float32).ravel())
            w.add_tensor(f"{name}.counts", [1, n_mat], _F32, e.counts.astype(np.float32))
            if e.sums is not None:
                w.add_tensor(f"{name}.in_sum", [n_cols, n_mat], _F32, e.sums.astype(np.float32).ravel())
        w.add_tensor(f"{name}.stats", [12], _F32, stats.get(name, _no_stats()))
    w.finish()


def save_dat(path: str, data: ImatrixData, dataset: str) -> None:
    """Write ``data`` in the legacy format: per entry ``(sum2 / count) * ncall`` (1.0 * ncall for an expert
    with no rows); entries with no rows at all are skipped."""
    size = max(data.chunk_size, 1)
    keep = sorted(n for n, e in data.entries.items() if e.counts.size and e.counts.any())
    out = [struct.pack("<i", len(keep))]
    for name in keep:
        e = data.entries[name]
        ncall = (int(e.counts.max()) + size - 1) // size
        counts = e.counts.astype(np.float32)[:, None]
        vals = e.sum2.astype(np.float32)
        vals = np.where(counts == 0, np.float32(1.0), vals / np.where(counts == 0, 1, counts))
        vals = (vals * np.float32(ncall)).astype("<f4").ravel()
        raw = name.encode()
        out += [struct.pack("<i", len(raw)), raw, struct.pack("<ii", ncall, vals.size), vals.tobytes()]
    if not dataset and data.datasets:
        dataset = data.datasets[-1]
    ds = dataset.encode()
    out += [struct.pack("<ii", data.chunk_count, len(ds)), ds]
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(b"".join(out))
    os.replace(tmp, path)


# -- statistics -------------------------------------------------------------------------------------------


def _no_stats() -> np.ndarray:
    return np.zeros(12, np.float32)


def _averages(e: ImatrixEntry, activations: bool) -> np.ndarray | None:
    src = e.sums if activations else e.sum2
    if src is None or not (e.counts > 0).any():
        return None
    c = e.counts.astype(np.float32)[:, None]
    avg = np.where(c > 0, src.astype(np.float32) / np.where(c > 0, c, 1), np.nan)
    return avg.ravel().astype(np.float64)


def vector_stats(e: ImatrixEntry) -> dict[str, float] | None:
    """Per-weight statistics of the mean activations (``sum_sq``, ``mean``, ``elements``, moments and
    the normalised entropy of the energy ``h_norm`` in percent); None when there is no data."""
    legacy = e.sums is None
    inv = np.where(e.counts > 0, 1.0 / np.maximum(e.counts, 1), np.nan)[:, None]
    val = (e.sum2 * inv).ravel()
    v = val if legacy else (e.sums * inv).ravel()  # type: ignore[operator]
    ok = np.isfinite(v) & np.isfinite(val)
    val, v = val[ok], v[ok]
    n = int(v.size)
    if n == 0:
        return None
    mean = float(v.mean())
    d = v - mean
    m2 = float((d * d).sum()) / n
    std = float(np.sqrt(np.float32(max(m2 if n > 1 else 0.0, 0.0))))
    skew = kurt = 0.0
    if std > 1e-10:
        skew = float((d**3).sum()) / n / (m2 * np.sqrt(m2))
        kurt = float((d**4).sum()) / n / (m2 * m2) - 3.0
    energy = float(val[val > 0].sum())
    entropy = 0.0
    if energy > 0:
        p = np.maximum(val, 0.0) / energy
        p = p[p > 1e-10]
        entropy = float(-(p * np.log(p)).sum() / np.log(2.0))
    h_norm = 100.0 * entropy / np.log2(np.float32(n)) if n > 1 else float("nan")
    return {
        "sum_sq": float(val.sum()),
        "mean": mean,
        "elements": float(n),
        "std_deviation": std,
        "skewness": skew,
        "kurtosis": kurt,
        "h_norm": float(h_norm),
        "legacy": float(legacy),
    }


def all_stats(data: ImatrixData) -> dict[str, np.ndarray]:
    """The 12 ``W.stats`` floats of every entry, comparing each block's weight with the nearest
    preceding block's weight of the same name (gain, l2_dist, cossim, pearson, covariance)."""
    vec = {n: s for n, e in data.entries.items() if (s := vector_stats(e)) is not None}
    out: dict[str, np.ndarray] = {}
    for name, s in vec.items():
        cmp = _compare(name, s, vec, data)
        row = [
            s["sum_sq"],
            s["mean"],
            s["elements"],
            s["std_deviation"],
            s["skewness"],
            s["kurtosis"],
            cmp[0],
            s["h_norm"],
            *cmp[1:],
        ]
        out[name] = np.array(row, np.float32)
    return out


def _compare(
    name: str, s: dict[str, float], vec: dict[str, dict[str, float]], data: ImatrixData
) -> list[float]:
    nan = float("nan")
    m = _BLK.search(name)
    if m is None or int(m.group(1)) <= 0:
        return [nan] * 5
    blk = int(m.group(1))
    prev = next(
        (
            cand
            for b in range(blk - 1, -1, -1)
            if (cand := name[: m.start()] + f"blk.{b}." + name[m.end() :]) in vec
        ),
        None,
    )
    if prev is None:
        return [nan] * 5
    ps = vec[prev]
    use_act = not s["legacy"] and not ps["legacy"]
    c, p = _averages(data.entries[name], use_act), _averages(data.entries[prev], use_act)
    if c is None or p is None or c.size != p.size:
        return [nan] * 5
    ok = np.isfinite(c) & np.isfinite(p)
    c, p = c[ok], p[ok]
    if c.size == 0:
        return [nan] * 5
    dc, dp = c - c.mean(), p - p.mean()
    n1, n2, vc, vp = float(c @ c), float(p @ p), float(dc @ dc), float(dp @ dp)
    cov = float(dc @ dp)
    l2 = float(np.sqrt(((c - p) ** 2).sum()))
    covariance = cov / c.size if c.size > 1 else nan
    if n1 > 0 and n2 > 0:
        cossim = float(np.clip(float(c @ p) / (np.sqrt(n1) * np.sqrt(n2)), -1, 1))
    else:
        cossim = nan if n1 == 0 and n2 == 0 else 0.0
    if vc > 0 and vp > 0:
        pearson = float(np.clip(cov / (np.sqrt(vc) * np.sqrt(vp)), -1, 1))
    else:
        pearson = nan if vc == 0 and vp == 0 else 0.0
    if ps["sum_sq"] > 1e-10:
        gain = float(np.sqrt(s["sum_sq"] / s["elements"]) / np.sqrt(ps["sum_sq"] / ps["elements"]))
    else:
        gain = 1.0 if s["sum_sq"] <= 1e-10 else nan
    return [gain, l2, cossim, pearson, covariance]
