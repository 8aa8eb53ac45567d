"""llama-quant: every ggml block format as numba kernels, byte-exact with llama.cpp.

>>> import numpy as np, llama_quant
>>> w = np.random.default_rng(0).standard_normal((4, 256), dtype=np.float32)
>>> raw = llama_quant.quantize(w, "q4_k")           # the bytes ggml_quantize_chunk writes
>>> raw.nbytes == 4 * llama_quant.row_nbytes("q4_k", 256)
True
>>> llama_quant.dequantize(raw, "q4_k", w.shape).shape
(4, 256)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gguf import GGMLQuantizationType

from llama_quant import compiling as _compiling  # noqa: F401  (first: where numba caches kernels)
from llama_quant import formats as _formats  # noqa: F401  (registers every format)
from llama_quant.registry import (
    BlockFormat,
    QTypeLike,
    UnsupportedTypeError,
    dequantize_types,
    get_format,
    quantize_types,
    resolve_qtype,
)

__all__ = [
    "DEQUANTIZE_TYPES",
    "QUANTIZE_TYPES",
    "BlockFormat",
    "GGMLQuantizationType",
    "QTypeLike",
    "UnsupportedTypeError",
    "block_size",
    "dequantize",
    "get_format",
    "quantize",
    "requires_imatrix",
    "resolve_qtype",
    "row_nbytes",
    "type_size",
]

QUANTIZE_TYPES: tuple[GGMLQuantizationType, ...] = tuple(quantize_types())
"""Types :func:`quantize` can produce, byte-identical to llama.cpp's ggml_quantize_chunk."""

DEQUANTIZE_TYPES: tuple[GGMLQuantizationType, ...] = tuple(dequantize_types())
"""Types :func:`dequantize` can read, bit-identical to gguf-py's ``gguf.quants.dequantize``."""

_NO_WEIGHTS = np.zeros(0, dtype=np.float32)


def block_size(qtype: QTypeLike) -> int:
    """Weights per block of ``qtype`` (1 for plain float types)."""
    return get_format(qtype).block_size


def type_size(qtype: QTypeLike) -> int:
    """Bytes per block of ``qtype``."""
    return get_format(qtype).type_size


def row_nbytes(qtype: QTypeLike, n: int) -> int:
    """Bytes of a row of ``n`` weights (``ggml_row_size``); ``n`` must be a multiple of the block size."""
    fmt = get_format(qtype)
    if n % fmt.block_size:
        raise ValueError(f"a {fmt.qtype.name} row needs a multiple of {fmt.block_size} weights, got {n}")
    return n // fmt.block_size * fmt.type_size


def requires_imatrix(qtype: QTypeLike) -> bool:
    """True for the types llama.cpp refuses to quantize without an importance matrix (IQ2_XXS, IQ2_XS, IQ1_S)."""
    return resolve_qtype(qtype) in (
        GGMLQuantizationType.IQ2_XXS,
        GGMLQuantizationType.IQ2_XS,
        GGMLQuantizationType.IQ1_S,
    )


def quantize(x: np.ndarray, qtype: QTypeLike, imatrix: np.ndarray | None = None) -> np.ndarray:
    """Quantize float32 rows ``x`` of shape (rows, cols) to ``qtype``; returns uint8[rows * row_nbytes].

    The bytes equal llama.cpp's ``ggml_quantize_chunk`` on the same rows. ``imatrix`` is a float32 vector of
    length ``cols`` (llama.cpp's quant_weights); types that ignore it in llama.cpp ignore it here too.
    """
    fmt = get_format(qtype, quantize=True)
    x = np.asarray(x)
    if x.ndim == 1:
        x = x.reshape(1, -1)
    if x.ndim != 2:
        raise ValueError(f"quantize expects a 2-D (rows, cols) array, got shape {x.shape}")
    nrows, ncols = x.shape
    if ncols % fmt.block_size:
        raise ValueError(
            f"{fmt.qtype.name} needs rows whose length is a multiple of {fmt.block_size}, got {ncols} columns"
        )
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if imatrix is None:
        if fmt.requires_imatrix:
            raise ValueError(f"quantizing to {fmt.qtype.name} requires an importance matrix")
        qw = _NO_WEIGHTS
    else:
        qw = np.ascontiguousarray(imatrix, dtype=np.float32).reshape(-1)
        if qw.size != ncols:
            raise ValueError(f"imatrix has {qw.size} values, expected one per column ({ncols})")
    out = np.empty(nrows * (ncols // fmt.block_size) * fmt.type_size, dtype=np.uint8)
    kernel = fmt.quantize_kernel
    assert kernel is not None  # get_format(quantize=True) checked it
    if out.size:
        kernel(x, qw, nrows, ncols, out)
    return out


def dequantize(
    raw: np.ndarray | bytes | memoryview, qtype: QTypeLike, shape: int | Sequence[int]
) -> np.ndarray:
    """Dequantize the bytes of a ``qtype`` tensor to float32 of ``shape`` (numpy order; last dim = row length).

    Bit-identical to ``gguf.quants.dequantize``.
    """
    fmt = get_format(qtype, dequantize=True)
    shape = (int(shape),) if isinstance(shape, int | np.integer) else tuple(int(s) for s in shape)
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if shape and shape[-1] % fmt.block_size:
        raise ValueError(
            f"{fmt.qtype.name} rows must be a multiple of {fmt.block_size} long, got {shape[-1]}"
        )
    buf = (
        np.frombuffer(raw, dtype=np.uint8)
        if not isinstance(raw, np.ndarray)
        else raw.reshape(-1).view(np.uint8)
    )
    need = n // fmt.block_size * fmt.type_size
    if buf.size != need:
        raise ValueError(f"{fmt.qtype.name} data of shape {shape} needs {need} bytes, got {buf.size}")
    buf = np.ascontiguousarray(buf)
    out = np.empty(n, dtype=np.float32)
    kernel = fmt.dequantize_kernel
    assert kernel is not None  # get_format(dequantize=True) checked it
    if n:
        kernel(buf, n, out)
    return out.reshape(shape)
