# mypy: ignore-errors
"""Reference runs of the grid i-quant quantizers: the same row algorithm executed by the Python
interpreter (numba's ``py_func``) instead of compiled, so a test can compare the compiled kernels with the
plain-Python semantics they are written in (the bytes against llama.cpp are checked by the parity tests).
Slow: meant for a few rows."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from llama_quant.formats import iq1_quant, iq2_quant, iq3_quant
from llama_quant.formats.iq_grid_init import grid_tables

__all__ = [
    "quantize_iq1_m",
    "quantize_iq1_s",
    "quantize_iq2_s",
    "quantize_iq2_xs",
    "quantize_iq2_xxs",
    "quantize_iq3_s",
    "quantize_iq3_xxs",
]


def _rows(row, qtype, type_size, x, qw, nrows, ncols, out) -> None:
    tables = grid_tables(qtype)
    rb = ncols // 256 * type_size
    qw = np.asarray(qw, np.float32)
    for r in range(nrows):
        row.py_func(
            x[r * ncols : (r + 1) * ncols], qw, qw.size > 0, out[r * rb : (r + 1) * rb], ncols, *tables
        )


def quantize_iq1_s(x, qw, nrows, ncols, out) -> None:
    _rows(iq1_quant._iq1_s_row, T.IQ1_S, 50, x, qw, nrows, ncols, out)


def quantize_iq1_m(x, qw, nrows, ncols, out) -> None:
    _rows(iq1_quant._iq1_m_row, T.IQ1_M, 56, x, qw, nrows, ncols, out)


def quantize_iq2_xxs(x, qw, nrows, ncols, out) -> None:
    _rows(iq2_quant._iq2_xxs_row, T.IQ2_XXS, 66, x, qw, nrows, ncols, out)


def quantize_iq2_xs(x, qw, nrows, ncols, out) -> None:
    _rows(iq2_quant._iq2_xs_row, T.IQ2_XS, 74, x, qw, nrows, ncols, out)


def quantize_iq2_s(x, qw, nrows, ncols, out) -> None:
    _rows(iq2_quant._iq2_s_row, T.IQ2_S, 82, x, qw, nrows, ncols, out)


def quantize_iq3_xxs(x, qw, nrows, ncols, out) -> None:
    _rows(iq3_quant._iq3_xxs_row, T.IQ3_XXS, 98, x, qw, nrows, ncols, out)


def quantize_iq3_s(x, qw, nrows, ncols, out) -> None:
    _rows(iq3_quant._iq3_s_row, T.IQ3_S, 110, x, qw, nrows, ncols, out)
