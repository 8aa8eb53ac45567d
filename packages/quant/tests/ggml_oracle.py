"""Test-only oracle: llama.cpp's own ggml_quantize_chunk, loaded from the installed llama_cpp package via ctypes.

Never imported by product code. ``load()`` returns None when llama_cpp (or its libggml-base) is missing.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from pathlib import Path

import numpy as np

__all__ = ["GGMLOracle", "load", "unavailable_reason"]


def _find_llama_cpp():
    try:
        return importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None


def _lib_path() -> Path | None:
    spec = _find_llama_cpp()
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
            p = Path(base) / "lib" / name
            if p.exists():
                return p
    return None


def unavailable_reason() -> str | None:
    if _find_llama_cpp() is None:
        return "llama_cpp (llama-cpp-python) is not installed; the nox 'parity' session installs it"
    if _lib_path() is None:
        return "llama_cpp is installed but its libggml-base shared library was not found"
    return None


class GGMLOracle:
    """ctypes binding of ggml_quantize_chunk / ggml_row_size / ggml_quantize_requires_imatrix."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_quantize_chunk.argtypes = [
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
        ]
        lib.ggml_row_size.restype = ctypes.c_size_t
        lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
        lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
        lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
        self._lib = lib

    def row_size(self, qtype: int, n: int) -> int:
        return int(self._lib.ggml_row_size(int(qtype), n))

    def requires_imatrix(self, qtype: int) -> bool:
        return bool(self._lib.ggml_quantize_requires_imatrix(int(qtype)))

    def quantize(self, x: np.ndarray, qtype: int, imatrix: np.ndarray | None = None) -> np.ndarray:
        """ggml_quantize_chunk over all rows of x [rows, cols]; returns the bytes."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        nrows, ncols = x.shape
        out = np.zeros(nrows * self.row_size(qtype, ncols), dtype=np.uint8)
        qw = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
        n = self._lib.ggml_quantize_chunk(
            int(qtype),
            x.ctypes.data,
            out.ctypes.data,
            0,
            nrows,
            ncols,
            None if qw is None else qw.ctypes.data,
        )
        assert n == out.size
        return out


@cache
def load() -> GGMLOracle | None:
    if unavailable_reason() is not None:
        return None
    path = _lib_path()
    assert path is not None
    return GGMLOracle(path)
