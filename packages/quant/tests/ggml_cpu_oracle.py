"""Test-only oracle: ggml-cpu's own activation quantizers and vec_dot kernels, through ctypes.

``ggml_get_type_traits_cpu(type)`` (libggml-cpu) gives ``from_float`` and ``vec_dot`` for a weight type; a
product is computed as ggml's mul_mat does it: each activation row converted with the vec_dot type's
``from_float``, then one ``vec_dot`` per output element. Parity is meant against a portable build of
llama.cpp (SIMD off, ggml's generic C kernels). Never imported by product code.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from pathlib import Path

import numpy as np

__all__ = ["GGMLCPU", "load", "unavailable_reason"]


def _lib_dir() -> Path | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        p = Path(base) / "lib"
        if (p / "libggml-cpu.so").exists() and (p / "libggml-base.so").exists():
            return p
    return None


def unavailable_reason() -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama_cpp (llama-cpp-python) is not installed; the nox 'parity' session installs it"
    if _lib_dir() is None:
        return "llama_cpp is installed but libggml-cpu / libggml-base were not found"
    return None


class _TraitsCPU(ctypes.Structure):
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


_FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_VEC_DOT = ctypes.CFUNCTYPE(
    None,
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
)
F32 = 0


class GGMLCPU:
    """ctypes binding of the CPU type traits of a llama.cpp build."""

    def __init__(self, lib_dir: Path) -> None:
        self._base = ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self._cpu = ctypes.CDLL(str(lib_dir / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        self._cpu.ggml_cpu_init.restype = None
        self._cpu.ggml_cpu_init()  # fills the fp16 tables the generic kernels may read
        self._cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TraitsCPU)
        self._cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        self._base.ggml_row_size.restype = ctypes.c_size_t
        self._base.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]

    def simd_features(self) -> list[str]:
        """The x86 SIMD features the library was compiled with (empty for a portable generic build)."""
        names = ("sse3", "ssse3", "avx", "avx2", "fma", "f16c", "avx512")
        found = []
        for name in names:
            fn = getattr(self._cpu, f"ggml_cpu_has_{name}", None)
            if fn is not None:
                fn.restype = ctypes.c_int
                if fn():
                    found.append(name)
        return found

    def vec_dot_type(self, qtype: int) -> int:
        return int(self._cpu.ggml_get_type_traits_cpu(int(qtype)).contents.vec_dot_type)

    def row_size(self, qtype: int, n: int) -> int:
        return int(self._base.ggml_row_size(int(qtype), n))

    def from_float(self, qtype: int, x: np.ndarray) -> np.ndarray:
        """Rows x [n, cols] converted with ``from_float`` of type ``qtype`` (an activation type): the bytes."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, cols = x.shape
        if int(qtype) == F32:
            return x.view(np.uint8).reshape(n, -1).copy()
        rs = self.row_size(qtype, cols)
        out = np.zeros((n, rs), np.uint8)
        fn = _FROM_FLOAT(self._cpu.ggml_get_type_traits_cpu(int(qtype)).contents.from_float)
        for t in range(n):
            fn(x[t].ctypes.data, out[t].ctypes.data, cols)
        return out

    def matmul(self, raw: np.ndarray, qtype: int, rows: int, cols: int, x: np.ndarray) -> np.ndarray:
        """out[n, rows] as ggml's mul_mat computes it: activations through from_float, one vec_dot each."""
        traits = self._cpu.ggml_get_type_traits_cpu(int(qtype)).contents
        vt = int(traits.vec_dot_type)
        xq = self.from_float(vt, np.asarray(x, np.float32).reshape(-1, cols))
        w = np.ascontiguousarray(np.asarray(raw).reshape(-1).view(np.uint8)).reshape(rows, -1)
        fn = _VEC_DOT(traits.vec_dot)
        n = xq.shape[0]
        out = np.zeros((n, rows), np.float32)
        s = ctypes.c_float()
        ps = ctypes.addressof(s)
        wp = w.ctypes.data
        wr = w.shape[1]
        for t in range(n):
            xp = xq[t].ctypes.data
            for r in range(rows):
                fn(cols, ps, 0, wp + r * wr, 0, xp, 0, 1)
                out[t, r] = s.value
        return out


@cache
def load() -> GGMLCPU | None:
    if unavailable_reason() is not None:
        return None
    d = _lib_dir()
    assert d is not None
    return GGMLCPU(d)
