"""GGUF format constants as data: value types, their sizes, limits this reader enforces.

The enums are gguf-py's own (`gguf.GGUFValueType`, `gguf.GGMLQuantizationType`), so code written against
gguf-py and against gguf-io speaks the same names.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

__all__ = [
    "DEFAULT_ALIGNMENT",
    "GGML_MAX_DIMS",
    "GGML_MAX_NAME",
    "GGML_QUANT_SIZES",
    "GGUF_MAGIC",
    "MAX_ARRAY_LENGTH",
    "MAX_KEY_LENGTH",
    "SCALAR_DTYPES",
    "SUPPORTED_VERSIONS",
    "GGMLQuantizationType",
    "GGUFValueType",
]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
# ggml's tensor names are char[64] including the terminating NUL (GGML_MAX_NAME in ggml.h).
GGML_MAX_NAME = 64
# Keys are short identifiers; llama.cpp accepts any length, but nothing real comes close to this.
MAX_KEY_LENGTH = 1 << 16
# No real metadata array is longer than a vocabulary; 2^31 keeps every length a valid C int and numpy index.
MAX_ARRAY_LENGTH = (1 << 31) - 1

# Little-endian numpy dtypes of the fixed-size value types (counterpart: GGUF_TYPE_SIZE in gguf.cpp).
SCALAR_DTYPES: dict[GGUFValueType, np.dtype] = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("<u1"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}
