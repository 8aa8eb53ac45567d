"""Quantize a whole model file: plan every tensor's type, then stream the converted tensors to a new GGUF.

The counterpart of llama.cpp's ``llama_model_quantize_impl``: tensors in ``weights_map`` order, metadata
copied key by key with ``general.quantization_version`` and ``general.file_type`` (then the
``quantize.imatrix.*`` keys) moved to the end, tensor data aligned to 32 bytes. The output is written to a
temporary file and renamed into place by :class:`gguf_io.GGUFWriter`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

import gguf_io
from gguf_io import GGUFValueType
from llama_quant import dequantize, quantize
from llama_quant.imatrix import Imatrix
from llama_quant.mixture import (
    MixtureParams,
    ModelInfo,
    TensorSpec,
    plan_types,
    tensor_requires_imatrix,
    weight_order,
)
from llama_quant.registry import get_format

__all__ = ["QuantizeError", "QuantizeOptions", "Summary", "TensorPlan", "build_plan", "run_quantize"]

GGML_QNT_VERSION = 2
_SLAB_ELEMENTS = 1 << 22  # f32 elements converted at a time (16 MiB), in whole rows
_IMATRIX_KEYS = (
    "quantize.imatrix.file",
    "quantize.imatrix.dataset",
    "quantize.imatrix.entries_count",
    "quantize.imatrix.chunks_count",
)


class QuantizeError(ValueError):
    """A model that cannot be quantized as asked (types, shapes, imatrix, requantizing)."""


@dataclass(slots=True)
class QuantizeOptions:
    """Everything llama-quantize's options decide, besides the file names."""

    mixture: MixtureParams
    allow_requantize: bool = False
    imatrix: Imatrix | None = None
    imatrix_file: str = ""
    nthread: int = 0
    dry_run: bool = False  # llama.cpp's --dry-run does not refuse requantizing


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """One tensor of the output: its shape (ggml order), source and target types and sizes in bytes."""

    name: str
    shape: tuple[int, ...]
    src_type: T
    dst_type: T
    src_nbytes: int
    dst_nbytes: int
    imatrix: np.ndarray | None = field(default=None, repr=False)

    @property
    def converts(self) -> bool:
        return self.src_type != self.dst_type


@dataclass(slots=True)
class Summary:
    """Totals of a run: bytes before and after, weights, seconds."""

    size_before: int = 0
    size_after: int = 0
    n_elements: int = 0
    seconds: float = 0.0
    fallbacks: tuple[str, ...] = ()

    def bpw(self, nbytes: int) -> float:
        return nbytes * 8.0 / self.n_elements if self.n_elements else 0.0


def _nbytes(t: T, shape: tuple[int, ...]) -> int:
    blck, size = GGML_QUANT_SIZES[t]
    n = 1
    for d in shape:
        n *= d
    return n // blck * size


def _trim(shape: tuple[int, ...]) -> tuple[int, ...]:
    """ggml_n_dims: gguf_write drops trailing dimensions of size 1."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return shape[:n]


def build_plan(f: gguf_io.GGUFFile, opts: QuantizeOptions) -> tuple[list[TensorPlan], tuple[str, ...]]:
    """The per-tensor plan (weight order) after every check that can fail before writing."""
    model = ModelInfo.from_metadata(f.metadata)
    specs = [TensorSpec(n, f.tensors[n].shape, f.tensors[n].ggml_type) for n in weight_order(list(f.tensors))]
    try:
        plan = plan_types(specs, model, opts.mixture)
    except ValueError as e:
        raise QuantizeError(str(e)) from None
    imat = opts.imatrix
    if imat is not None:
        for name, v in imat.entries.items():
            if not np.all(np.isfinite(v)):
                raise QuantizeError(f"imatrix contains a non-finite value (entry {name})")
    out: list[TensorPlan] = []
    for s in specs:
        dst = plan.types[s.name]
        plan_i = TensorPlan(
            s.name, s.shape, s.ggml_type, dst, f.tensors[s.name].nbytes, _nbytes(dst, s.shape)
        )
        if plan_i.converts:
            plan_i = _check_conversion(plan_i, s, opts, imat)
        elif imat is None and s.name in plan.quantized:
            needs = tensor_requires_imatrix(s.name, dst, opts.mixture.ftype)
            if needs and not opts.mixture.only_copy and not opts.dry_run:
                raise QuantizeError(f"this quantization requires an imatrix ({s.name} -> {dst.name})")
        out.append(plan_i)
    return out, plan.fallbacks


def _check_conversion(
    p: TensorPlan, s: TensorSpec, opts: QuantizeOptions, imat: Imatrix | None
) -> TensorPlan:
    if p.shape[0] % GGML_QUANT_SIZES[p.dst_type][0]:
        raise QuantizeError(f"tensor {p.name}: row length {p.shape[0]} does not fit {p.dst_type.name} blocks")
    try:
        get_format(p.dst_type, quantize=True)
        get_format(p.src_type, dequantize=True)
    except ValueError as e:
        raise QuantizeError(f"tensor {p.name}: {e}") from None
    vec = None
    if imat is not None and p.name in imat.entries:
        v = imat.entries[p.name]
        want = s.ne(0) * s.ne(2)
        if v.size == want:
            vec = v
        elif p.name not in ("token_embd.weight", "per_layer_token_embd.weight"):
            raise QuantizeError(f"imatrix size {v.size} is different from tensor size {want} for {p.name}")
    if vec is None and not opts.dry_run and tensor_requires_imatrix(p.name, p.dst_type, opts.mixture.ftype):
        what = "this quantization requires an imatrix" if imat is None else "missing importance matrix"
        raise QuantizeError(f"{what}: tensor {p.name} -> {p.dst_type.name}")
    if p.src_type not in (T.F32, T.F16, T.BF16) and not opts.allow_requantize and not opts.dry_run:
        raise QuantizeError(
            f"requantizing from type {p.src_type.name} is disabled ({p.name}); use --allow-requantize"
        )
    return TensorPlan(p.name, p.shape, p.src_type, p.dst_type, p.src_nbytes, p.dst_nbytes, vec)


def convert_tensor(raw: np.ndarray, p: TensorPlan) -> np.ndarray:
    """Convert one tensor's bytes to its target type, a slab of whole rows at a time."""
    ne0 = p.shape[0]
    nrows = 1
    for d in p.shape[1:]:
        nrows *= d
    rows_per_expert = p.shape[1] if len(p.shape) > 1 else 1
    src_row = _nbytes(p.src_type, (ne0,))
    dst_row = _nbytes(p.dst_type, (ne0,))
    out = np.empty(nrows * dst_row, dtype=np.uint8)
    slab = max(1, _SLAB_ELEMENTS // max(ne0, 1))
    r = 0
    while r < nrows:
        # a slab never crosses an expert boundary: each expert has its own importance slice
        expert = r // rows_per_expert
        n = min(slab, nrows - r, (expert + 1) * rows_per_expert - r)
        src = raw[r * src_row : (r + n) * src_row]
        if p.src_type == T.F32:
            x = src.view(np.float32).reshape(n, ne0)
        else:
            x = dequantize(src, p.src_type, (n, ne0))
        qw = None if p.imatrix is None else p.imatrix[expert * ne0 : (expert + 1) * ne0]
        out[r * dst_row : (r + n) * dst_row] = quantize(x, p.dst_type, qw)
        r += n
    return out


def _metadata(f: gguf_io.GGUFFile, w: gguf_io.GGUFWriter, ftype: int, opts: QuantizeOptions) -> None:
    late = {
        "general.quantization_version",
        "general.file_type",
        "split.no",
        "split.count",
        "split.tensors.count",
    }
    imat = opts.imatrix
    if imat is not None:
        late.update(_IMATRIX_KEYS)
    for name, fld in f.fields.items():
        if name not in late:
            w.add_field(fld)
    w.add_metadata("general.quantization_version", GGML_QNT_VERSION, GGUFValueType.UINT32)
    w.add_metadata("general.file_type", ftype, GGUFValueType.UINT32)
    if imat is not None:
        # llama-quantize's kv overrides: strncpy(..., 127) and an int override stored as uint32
        fname = opts.imatrix_file.encode("utf-8")[:127].decode("utf-8", "ignore")
        w.add_metadata("quantize.imatrix.file", fname, GGUFValueType.STRING)
        if imat.datasets:
            ds = imat.datasets[0].encode("utf-8")[:127].decode("utf-8", "ignore")
            w.add_metadata("quantize.imatrix.dataset", ds, GGUFValueType.STRING)
        w.add_metadata("quantize.imatrix.entries_count", len(imat.entries), GGUFValueType.UINT32)
        if imat.chunk_count > 0:
            w.add_metadata("quantize.imatrix.chunks_count", imat.chunk_count, GGUFValueType.UINT32)


def _line(i: int, n: int, p: TensorPlan) -> str:
    dims = ", ".join(f"{d:5d}" for d in (*p.shape, *([1] * (4 - len(p.shape)))))
    head = f"[{i:4d}/{n:4d}] {p.name:<36s} - [{dims}], type = {p.src_type.name.lower():>6s}, "
    mib_a, mib_b = p.src_nbytes / 1048576, p.dst_nbytes / 1048576
    if p.converts:
        return (
            head + f"converting to {p.dst_type.name.lower()} .. size = {mib_a:8.2f} MiB -> {mib_b:8.2f} MiB"
        )
    return head + f"size = {mib_a:8.3f} MiB"


def run_quantize(
    inp: str,
    out: str | None,
    ftype: int,
    opts: QuantizeOptions,
    log: Callable[[str], None] = print,
) -> Summary:
    """Quantize ``inp`` to ``out`` (None: dry run, nothing written). Errors: GGUFError, QuantizeError."""
    t0 = time.perf_counter()
    opts.dry_run = out is None
    if opts.nthread > 0:
        import numba

        limit = int(getattr(numba.config, "NUMBA_NUM_THREADS", 1))
        numba.set_num_threads(max(1, min(opts.nthread, limit)))
    with gguf_io.open(inp) as f:
        if opts.mixture.only_copy:
            ftype = int(f.metadata.get("general.file_type", ftype))
        plans, fallbacks = build_plan(f, opts)
        summary = Summary(fallbacks=fallbacks)
        for p in plans:
            summary.size_before += p.src_nbytes
            summary.size_after += p.dst_nbytes
            n = 1
            for d in p.shape:
                n *= d
            summary.n_elements += n
        if out is None:
            for i, p in enumerate(plans, 1):
                log(_line(i, len(plans), p))
            needs = [p.name for p in plans if p.converts and p.imatrix is None and _needs_imatrix(p, opts)]
            if needs:
                log(f"warning: this quantization will require an imatrix (first: {needs[0]})")
        else:
            w = gguf_io.GGUFWriter(out)
            _metadata(f, w, ftype, opts)
            for i, p in enumerate(plans, 1):
                w.add_tensor(p.name, _trim(p.shape), p.dst_type, _producer(f, p, i, len(plans), log))
            w.finish()
            _default_mode(out)
    summary.seconds = time.perf_counter() - t0
    return summary


def _needs_imatrix(p: TensorPlan, opts: QuantizeOptions) -> bool:
    return tensor_requires_imatrix(p.name, p.dst_type, opts.mixture.ftype)


def _producer(f: gguf_io.GGUFFile, p: TensorPlan, i: int, n: int, log: Callable[[str], None]):
    def produce() -> np.ndarray:
        raw = f.tensor_bytes(p.name)
        data = convert_tensor(raw, p) if p.converts else raw
        log(_line(i, n, p))
        return data

    return produce


def _default_mode(path: str) -> None:
    """Give the output the permissions a plain ``open()`` would (the writer's temp file starts as 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def describe(summary: Summary) -> list[str]:
    """The summary lines: sizes before and after, bits per weight, time."""
    mib = 1048576
    lines = [
        f"model size  = {summary.size_before / mib:8.2f} MiB ({summary.bpw(summary.size_before):.2f} BPW)",
        f"quant size  = {summary.size_after / mib:8.2f} MiB ({summary.bpw(summary.size_after):.2f} BPW)",
    ]
    if summary.fallbacks:
        lines.append(f"{len(summary.fallbacks)} tensor(s) required fallback quantization")
    lines.append(f"total time  = {summary.seconds * 1000:8.2f} ms")
    return lines


def ensure_distinct(inp: str, out: str) -> None:
    """llama-quantize refuses to write over its input."""
    try:
        same = os.path.samefile(inp, out)
    except OSError:
        same = False
    if same:
        raise QuantizeError(f"input and output files are the same: {inp!r}")


__all__ += ["convert_tensor", "describe", "ensure_distinct"]
