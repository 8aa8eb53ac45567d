# mypy: ignore-errors
# (numba kernel code: scalar types follow numba's typing, not numpy's stubs)
"""The loops every block format runs: quantize over spans of rows (or over blocks), dequantize over chunks of
blocks.

A format writes only its per-row (or per-span) and per-block kernels and declares its public kernels as
one call each::

    @njit(cache=True, parallel=True, error_model="numpy")
    def quantize_q4_0(x, qw, nrows, ncols, out):
        quantize_rows(_q4_0_row, x, qw, nrows, ncols, out, 32, 18)

The drivers are ``inline="always"``: numba pastes their loop into each public kernel, so the ``prange``
becomes that kernel's parallel loop, the per-row or per-block kernel is a direct call that LLVM can inline,
and every public kernel stays a top-level function of its own module, cached under its own name. (A driver
compiled on its own with the kernel as a first-class argument would also work, but numba keys such a
specialization on the dispatcher object, so its cache entry is never found again in a new process.)
"""

from __future__ import annotations

from numba import njit, prange

__all__ = ["DQ_CHUNK_WEIGHTS", "dequantize_blocks", "quantize_blocks", "quantize_rows"]

DQ_CHUNK_WEIGHTS = 16384  # weights per parallel chunk of a dequantize


@njit(inline="always", error_model="numpy")
def quantize_rows(row, x, qw, nrows, ncols, out, block_size, type_size, span=1, nmax=0):
    """``row(x_span, qw, use_qw, out_span, ncols, nmax)`` over spans of ``span`` whole rows, on all threads.

    x: float32[nrows * ncols] (ggml rows); qw: float32[ncols] importance weights or float32[0] for none;
    out: uint8[nrows * ncols / block_size * type_size]. ``nmax`` is passed through for a row kernel that
    serves two formats (Q4_1 and Q5_1, Q4_K and Q5_K); the others ignore it."""
    rb = ncols // block_size * type_size
    use_qw = qw.size > 0
    for c in prange((nrows + span - 1) // span):
        r0 = c * span
        r1 = min(nrows, r0 + span)
        row(x[r0 * ncols : r1 * ncols], qw, use_qw, out[r0 * rb : r1 * rb], ncols, nmax)


@njit(inline="always", error_model="numpy")
def quantize_blocks(block, x, nrows, ncols, out, block_size, type_size):
    """``block(x_block, out_block)`` over every block, row by row on all threads: for the formats whose blocks
    need nothing of their row (no importance weights, no row statistics). Arrays as ``quantize_rows``."""
    nb = ncols // block_size
    for r in prange(nrows):
        for i in range(r * nb, (r + 1) * nb):
            block(x[i * block_size : (i + 1) * block_size], out[i * type_size : (i + 1) * type_size])


@njit(inline="always", error_model="numpy")
def dequantize_blocks(block, raw, n, out, block_size, type_size):
    """``block(raw_block, out_block)`` over the n / block_size blocks, in chunks on all threads.

    raw: uint8[n / block_size * type_size]; out: float32[n]."""
    nb = n // block_size
    chunk = max(1, DQ_CHUNK_WEIGHTS // block_size)
    for c in prange((nb + chunk - 1) // chunk):
        for i in range(c * chunk, min(nb, (c + 1) * chunk)):
            block(raw[i * type_size : (i + 1) * type_size], out[i * block_size : (i + 1) * block_size])
