"""Quantize a whole model file: plan every tensor's type, then stream the converted tensors to a new GGUF.

The counterpart of llama.cpp's ``llama_model_quantize_impl``: tensors in ``weights_map`` order, metadata
copied key by key with ``general.quantization_version`` and ``general.file_type`` (then the
``quantize.imatrix.*`` keys) moved to the end, tensor data aligned to 32 bytes. The output is written to a
temporary file and renamed into place by :class:`gguf_io.GGUFWriter`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

import gguf_io
from gguf_io import Field, GGUFValueType
from llama_quant import dequantize
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
from llama_quant.rewrite import KVOverride, OverrideTag, apply_to_metadata, override_field, remap_layers
from llama_quant.validate import decode_f16, row_data_error

__all__ = ["QuantizeError", "QuantizeOptions", "Summary", "TensorPlan", "build_plan", "run_quantize"]

GGML_QNT_VERSION = 2
_SLAB_ELEMENTS = 1 << 22  # f32 elements converted at a time (16 MiB), in whole rows
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


class QuantizeError(ValueError):
    """A model that cannot be quantized as asked (types, shapes, imatrix, requantizing); ``banner`` is the
    framed explanation llama-quantize logs before some of these errors ("" for none)."""

    def __init__(self, message: str, banner: str = "") -> None:
        super().__init__(message)
        self.banner = banner


_RULE = "=" * 76


def _imatrix_required(name: str, dst: T, have_imatrix: bool) -> QuantizeError:
    """llama-quantize's refusal of a very low-bit tensor without importance data (its messages)."""
    if not have_imatrix:
        banner = (
            f"{_RULE}\n ERROR: this quantization requires an importance matrix!\n"
            f"        - offending tensor: {name}\n        - target type: {dst.name.lower()}\n{_RULE}"
        )
        return QuantizeError("this quantization requires an imatrix!", banner)
    what = f"Missing importance matrix for tensor {name} in a very low-bit quantization"
    return QuantizeError(what, f"{'=' * 60}\n{what}\nThe result will be garbage, so bailing out\n{'=' * 60}")


@dataclass(slots=True)
class QuantizeOptions:
    """Everything llama-quantize's options decide, besides the file names."""

    mixture: MixtureParams
    allow_requantize: bool = False
    imatrix: Imatrix | None = None
    imatrix_file: str = ""
    nthread: int = 0
    dry_run: bool = False  # llama.cpp's --dry-run does not refuse requantizing
    keep_split: bool = False  # write the input's shards as the same shards (``out`` is then a name prefix)
    prune_layers: tuple[int, ...] = ()  # sorted, distinct block numbers to leave out
    kv_overrides: list[KVOverride] = field(default_factory=list)  # written in order, after the copied keys
    max_buf_size: int = 0  # bytes of tensor rows converted at a time (0: the default slab)


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
    source: str = ""  # the tensor's name in the input when pruning renumbered it
    shard: int = 0  # the input shard holding it (the output shard with keep_split)

    @property
    def src(self) -> str:
        return self.source or self.name

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
    model = ModelInfo.from_metadata(apply_to_metadata(f.metadata, opts.kv_overrides))
    names, _ = remap_layers(weight_order(list(f.tensors)), opts.prune_layers)
    order = list(names)
    if opts.keep_split:  # llama.cpp sorts the weights by (shard, offset): the mixture counters follow
        order.sort(key=lambda n: (f.tensors[n].shard, f.tensors[n].offset))
    source = {names[n]: n for n in order}
    specs = [TensorSpec(names[n], f.tensors[n].shape, f.tensors[n].ggml_type) for n in order]
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
        info = f.tensors[source[s.name]]
        renamed = "" if info.name == s.name else info.name
        plan_i = TensorPlan(
            s.name, s.shape, s.ggml_type, dst, info.nbytes, _nbytes(dst, s.shape), None, renamed, info.shard
        )
        if plan_i.converts:
            plan_i = _check_conversion(plan_i, s, opts, imat)
        elif imat is None and s.name in plan.quantized:
            needs = tensor_requires_imatrix(s.name, dst, opts.mixture.ftype)
            if needs and not opts.mixture.only_copy and not opts.dry_run:
                raise _imatrix_required(s.name, dst, False)
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
    if imat is not None and p.src in imat.entries:  # remap_imatrix: the entry of the original layer
        v = imat.entries[p.src]
        want = s.ne(0) * s.ne(2)
        if v.size == want:
            vec = v
        elif p.name not in ("token_embd.weight", "per_layer_token_embd.weight"):
            raise QuantizeError(f"imatrix size {v.size} is different from tensor size {want} for {p.name}")
    if vec is None and not opts.dry_run and tensor_requires_imatrix(p.name, p.dst_type, opts.mixture.ftype):
        raise _imatrix_required(p.name, p.dst_type, imat is not None)
    if p.src_type not in (T.F32, T.F16, T.BF16) and not opts.allow_requantize and not opts.dry_run:
        raise QuantizeError(
            f"requantizing from type {p.src_type.name} is disabled ({p.name}); use --allow-requantize"
        )
    return TensorPlan(
        p.name, p.shape, p.src_type, p.dst_type, p.src_nbytes, p.dst_nbytes, vec, p.source, p.shard
    )


def convert_tensor(raw: np.ndarray, p: TensorPlan, max_buf_size: int = 0) -> np.ndarray:
    """Convert one tensor's bytes to its target type, a slab of whole rows at a time.

    Every source slab and every converted slab is checked as llama.cpp's ``ggml_validate_row_data``
    checks them (NaN / inf in float data or block scales): QuantizeError naming the tensor.
    """
    ne0 = p.shape[0]
    nrows = 1
    for d in p.shape[1:]:
        nrows *= d
    rows_per_expert = p.shape[1] if len(p.shape) > 1 else 1
    src_row = _nbytes(p.src_type, (ne0,))
    dst_row = _nbytes(p.dst_type, (ne0,))
    out = np.empty(nrows * dst_row, dtype=np.uint8)
    slab = max(1, _SLAB_ELEMENTS // max(ne0, 1))
    if max_buf_size > 0:  # llama.cpp's nrows_slab: source, destination and f32 rows under the limit
        per_row = src_row + dst_row + (0 if p.src_type == T.F32 else 4 * ne0)
        slab = max(1, min(slab, max_buf_size // per_row))
    kernel = get_format(p.dst_type, quantize=True).quantize_kernel
    assert kernel is not None
    f32 = _scratch(0 if p.src_type == T.F32 else slab * ne0)
    r = 0
    while r < nrows:
        # a slab never crosses an expert boundary: each expert has its own importance slice
        expert = r // rows_per_expert
        n = min(slab, nrows - r, (expert + 1) * rows_per_expert - r)
        src = raw[r * src_row : (r + n) * src_row]
        if p.src_type == T.F16:  # the common case: decode and validate in one pass
            x = f32[: n * ne0]
            err = decode_f16(src.view(np.uint16), x)
            if err is not None:  # the block index within the tensor, as llama.cpp reads it in one piece
                err = row_data_error(p.src_type, raw, 0)
        else:
            err = row_data_error(p.src_type, src, r * src_row // GGML_QUANT_SIZES[p.src_type][1])
        if err is not None:
            raise QuantizeError(f"tensor {p.name!r} has invalid data ({err})")
        if p.src_type == T.F32:
            x = src.view(np.float32)
        elif p.src_type != T.F16:
            x = f32[: n * ne0]
            x[:] = dequantize(src, p.src_type, n * ne0)
        qw = _NO_WEIGHTS if p.imatrix is None else p.imatrix[expert * ne0 : (expert + 1) * ne0]
        dst = out[r * dst_row : (r + n) * dst_row]
        kernel(x, np.ascontiguousarray(qw, dtype=np.float32), n, ne0, dst)
        err = row_data_error(p.dst_type, dst, r * dst_row // GGML_QUANT_SIZES[p.dst_type][1])
        if err is not None:
            raise QuantizeError(f"tensor {p.name!r}: quantized data validation failed ({err})")
        r += n
    return out


_NO_WEIGHTS = np.zeros(0, dtype=np.float32)
_SCRATCH: list[np.ndarray] = []


def _scratch(n: int) -> np.ndarray:
    """A float32 buffer of at least ``n`` values, reused from tensor to tensor (no page faults per slab)."""
    if not _SCRATCH or _SCRATCH[0].size < n:
        _SCRATCH[:] = [np.empty(max(n, 1), dtype=np.float32)]
    return _SCRATCH[0]


def _set(kv: dict[str, Field], key: str, vtype: GGUFValueType, value: object) -> None:
    """gguf_set_val_*: the key is removed and appended at the end."""
    kv.pop(key, None)
    kv[key] = Field(key, vtype, value, None)


def _imatrix_overrides(opts: QuantizeOptions) -> list[KVOverride]:
    """The kv overrides llama-quantize adds for an imatrix (strncpy(..., 127); counts as ints)."""
    imat = opts.imatrix
    if imat is None:
        return []
    out = [KVOverride("quantize.imatrix.file", OverrideTag.STR, _c_str(opts.imatrix_file))]
    if imat.datasets:
        out.append(KVOverride("quantize.imatrix.dataset", OverrideTag.STR, _c_str(imat.datasets[0])))
    out.append(KVOverride("quantize.imatrix.entries_count", OverrideTag.INT, len(imat.entries)))
    if imat.chunk_count > 0:
        out.append(KVOverride("quantize.imatrix.chunks_count", OverrideTag.INT, imat.chunk_count))
    return out


def _c_str(s: str) -> str:
    return s.encode("utf-8")[:127].decode("utf-8", "ignore")


def output_metadata(f: gguf_io.GGUFFile, ftype: int, opts: QuantizeOptions) -> dict[str, Field]:
    """The keys of the output's first shard, in llama_model_quantize_impl's order (without split keys).

    Input keys copied, the quantization version and file type reset, ``split.*`` removed, then every
    override (the user's, then the imatrix ones) and, after pruning, ``{arch}.block_count``.
    """
    kv = dict(f.fields)
    _set(kv, "general.quantization_version", GGUFValueType.UINT32, GGML_QNT_VERSION)
    _set(kv, "general.file_type", GGUFValueType.UINT32, ftype)
    for key in _SPLIT_KEYS:
        kv.pop(key, None)
    for o in [*opts.kv_overrides, *_imatrix_overrides(opts)]:
        vtype, value = override_field(o)
        _set(kv, o.key, vtype, value)
    _, block_count = remap_layers(weight_order(list(f.tensors)), opts.prune_layers)
    if block_count >= 0:
        arch = str(f.metadata.get("general.architecture", ""))
        _set(kv, f"{arch}.block_count", GGUFValueType.UINT32, block_count)
    return kv


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
    """Quantize ``inp`` to ``out`` (None: dry run, nothing written). Errors: GGUFError, QuantizeError.

    With ``opts.keep_split`` ``out`` is a name prefix: the shards are ``out-0000i-of-0000N.gguf``.
    """
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
        summary.n_elements = sum(t.n_elements for t in f.tensors.values())  # ml.n_elements: before pruning
        n_all = len(f.tensors)
        if out is None:
            for i, p in enumerate(plans, 1):
                log(_line(i, n_all, p))
            needs = [p.name for p in plans if p.converts and p.imatrix is None and _needs_imatrix(p, opts)]
            if needs:
                log(f"warning: this quantization will require an imatrix (first: {needs[0]})")
        else:
            try:
                _write(f, out, plans, output_metadata(f, ftype, opts), opts, log)
            finally:
                _SCRATCH.clear()
    summary.seconds = time.perf_counter() - t0
    return summary


def _needs_imatrix(p: TensorPlan, opts: QuantizeOptions) -> bool:
    return tensor_requires_imatrix(p.name, p.dst_type, opts.mixture.ftype)


def output_paths(out: str, opts: QuantizeOptions, n_split: int) -> list[str]:
    """The files written: ``out`` itself, or with keep_split ``out-0000i-of-0000N.gguf`` (even for one)."""
    if not opts.keep_split:
        return [out]
    return [gguf_io.split_path(out, i, n_split) for i in range(n_split)]


def _write(
    f: gguf_io.GGUFFile,
    out: str,
    plans: list[TensorPlan],
    kv: dict[str, Field],
    opts: QuantizeOptions,
    log: Callable[[str], None],
) -> None:
    n_split = 1 + max((p.shard for p in plans), default=0) if opts.keep_split else 1
    paths = output_paths(out, opts, n_split)
    for path in paths:
        for src in f.paths:
            ensure_distinct(src, path)
    shards: list[list[TensorPlan]] = [[] for _ in range(n_split)]
    for p in plans:
        shards[p.shard if opts.keep_split else 0].append(p)
    for i in range(1, n_split):
        if not shards[i]:
            raise QuantizeError(f"--keep-split: no tensor is left for shard {i + 1} of {n_split}")
    done: list[str] = []
    counter = iter(range(1, len(plans) + 1))
    try:
        for i, (path, tensors) in enumerate(zip(paths, shards, strict=True)):
            w = gguf_io.GGUFWriter(path)
            for fld in kv.values() if i == 0 else ():
                w.add_field(fld)
            if n_split > 1:
                w.add_metadata("split.no", i, GGUFValueType.UINT16)
                w.add_metadata("split.count", n_split, GGUFValueType.UINT16)
                w.add_metadata("split.tensors.count", len(plans), GGUFValueType.INT32)
            for p in tensors:
                w.add_tensor(p.name, _trim(p.shape), p.dst_type, _producer(f, p, next(counter), opts, log))
            done += w.finish()
            _default_mode(path)
    except BaseException:
        for path in done:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise


def _producer(f: gguf_io.GGUFFile, p: TensorPlan, i: int, opts: QuantizeOptions, log: Callable[[str], None]):
    n = len(f.tensors)

    def produce() -> np.ndarray:
        raw = f.tensor_bytes(p.src)
        if p.converts:
            data = convert_tensor(raw, p, opts.max_buf_size)
        else:
            err = row_data_error(p.src_type, raw)  # the model loader's check_tensors
            if err is not None:
                raise QuantizeError(f"tensor {p.name!r} has invalid data ({err})")
            data = raw
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


__all__ += ["convert_tensor", "describe", "ensure_distinct", "output_metadata", "output_paths"]
