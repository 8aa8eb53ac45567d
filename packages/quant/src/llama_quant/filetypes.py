"""llama-quantize's file types: the ``llama_ftype`` ids, their names and base ggml types.

``FILE_TYPES`` is ``QUANT_OPTIONS`` of ``tools/quantize/quantize.cpp``; ``default_type`` is
``llama_ftype_get_default_type`` of ``src/llama-quant.cpp``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from gguf import GGMLQuantizationType as T

__all__ = ["FILE_TYPES", "F", "FileType", "default_type", "parse_file_type", "parse_ggml_type"]


class F(enum.IntEnum):
    """llama_ftype (include/llama.h)."""

    ALL_F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q8_0 = 7
    Q5_0 = 8
    Q5_1 = 9
    Q2_K = 10
    Q3_K_S = 11
    Q3_K_M = 12
    Q3_K_L = 13
    Q4_K_S = 14
    Q4_K_M = 15
    Q5_K_S = 16
    Q5_K_M = 17
    Q6_K = 18
    IQ2_XXS = 19
    IQ2_XS = 20
    Q2_K_S = 21
    IQ3_XS = 22
    IQ3_XXS = 23
    IQ1_S = 24
    IQ4_NL = 25
    IQ3_S = 26
    IQ3_M = 27
    IQ2_S = 28
    IQ2_M = 29
    IQ4_XS = 30
    IQ1_M = 31
    BF16 = 32
    TQ1_0 = 36
    TQ2_0 = 37
    MXFP4_MOE = 38
    Q1_0 = 40
    Q2_0 = 41


@dataclass(frozen=True, slots=True)
class FileType:
    """One entry of llama-quantize's type list: its name, llama_ftype id and description."""

    name: str
    ftype: int
    desc: str


# tools/quantize/quantize.cpp QUANT_OPTIONS, in its order (numeric lookup takes the first match).
FILE_TYPES: tuple[FileType, ...] = tuple(
    FileType(n, int(f), d)
    for n, f, d in [
        ("Q1_0", F.Q1_0, " 1.125 bpw quantization"),
        ("Q2_0", F.Q2_0, " 2.25 bpw quantization (group 64)"),
        ("Q4_0", F.Q4_0, " 4.34G, +0.4685 ppl @ Llama-3-8B"),
        ("Q4_1", F.Q4_1, " 4.78G, +0.4511 ppl @ Llama-3-8B"),
        ("MXFP4_MOE", F.MXFP4_MOE, " MXFP4 MoE"),
        ("Q5_0", F.Q5_0, " 5.21G, +0.1316 ppl @ Llama-3-8B"),
        ("Q5_1", F.Q5_1, " 5.65G, +0.1062 ppl @ Llama-3-8B"),
        ("IQ2_XXS", F.IQ2_XXS, " 2.06 bpw quantization"),
        ("IQ2_XS", F.IQ2_XS, " 2.31 bpw quantization"),
        ("IQ2_S", F.IQ2_S, " 2.5  bpw quantization"),
        ("IQ2_M", F.IQ2_M, " 2.7  bpw quantization"),
        ("IQ1_S", F.IQ1_S, " 1.56 bpw quantization"),
        ("IQ1_M", F.IQ1_M, " 1.75 bpw quantization"),
        ("TQ1_0", F.TQ1_0, " 1.69 bpw ternarization"),
        ("TQ2_0", F.TQ2_0, " 2.06 bpw ternarization"),
        ("Q2_K", F.Q2_K, " 2.96G, +3.5199 ppl @ Llama-3-8B"),
        ("Q2_K_S", F.Q2_K_S, " 2.96G, +3.1836 ppl @ Llama-3-8B"),
        ("IQ3_XXS", F.IQ3_XXS, " 3.06 bpw quantization"),
        ("IQ3_S", F.IQ3_S, " 3.44 bpw quantization"),
        ("IQ3_M", F.IQ3_M, " 3.66 bpw quantization mix"),
        ("Q3_K", F.Q3_K_M, "alias for Q3_K_M"),
        ("IQ3_XS", F.IQ3_XS, " 3.3 bpw quantization"),
        ("Q3_K_S", F.Q3_K_S, " 3.41G, +1.6321 ppl @ Llama-3-8B"),
        ("Q3_K_M", F.Q3_K_M, " 3.74G, +0.6569 ppl @ Llama-3-8B"),
        ("Q3_K_L", F.Q3_K_L, " 4.03G, +0.5562 ppl @ Llama-3-8B"),
        ("IQ4_NL", F.IQ4_NL, " 4.50 bpw non-linear quantization"),
        ("IQ4_XS", F.IQ4_XS, " 4.25 bpw non-linear quantization"),
        ("Q4_K", F.Q4_K_M, "alias for Q4_K_M"),
        ("Q4_K_S", F.Q4_K_S, " 4.37G, +0.2689 ppl @ Llama-3-8B"),
        ("Q4_K_M", F.Q4_K_M, " 4.58G, +0.1754 ppl @ Llama-3-8B"),
        ("Q5_K", F.Q5_K_M, "alias for Q5_K_M"),
        ("Q5_K_S", F.Q5_K_S, " 5.21G, +0.1049 ppl @ Llama-3-8B"),
        ("Q5_K_M", F.Q5_K_M, " 5.33G, +0.0569 ppl @ Llama-3-8B"),
        ("Q6_K", F.Q6_K, " 6.14G, +0.0217 ppl @ Llama-3-8B"),
        ("Q8_0", F.Q8_0, " 7.96G, +0.0026 ppl @ Llama-3-8B"),
        ("F16", F.F16, "14.00G, +0.0020 ppl @ Mistral-7B"),
        ("BF16", F.BF16, "14.00G, -0.0050 ppl @ Mistral-7B"),
        ("F32", F.ALL_F32, "26.00G              @ 7B"),
        ("COPY", F.ALL_F32, "only copy tensors, no quantizing"),
    ]
)

_DEFAULT_TYPE: dict[int, T] = {
    F.Q4_0: T.Q4_0, F.Q4_1: T.Q4_1, F.Q5_0: T.Q5_0, F.Q5_1: T.Q5_1, F.Q8_0: T.Q8_0,
    F.F16: T.F16, F.BF16: T.BF16, F.ALL_F32: T.F32, F.MXFP4_MOE: T.MXFP4,
    F.Q2_K_S: T.Q2_K, F.Q2_K: T.Q2_K, F.IQ3_XS: T.IQ3_S,
    F.Q3_K_S: T.Q3_K, F.Q3_K_M: T.Q3_K, F.Q3_K_L: T.Q3_K,
    F.Q4_K_S: T.Q4_K, F.Q4_K_M: T.Q4_K, F.Q5_K_S: T.Q5_K, F.Q5_K_M: T.Q5_K, F.Q6_K: T.Q6_K,
    F.TQ1_0: T.TQ1_0, F.TQ2_0: T.TQ2_0, F.IQ2_XXS: T.IQ2_XXS, F.IQ2_XS: T.IQ2_XS, F.IQ2_S: T.IQ2_XS,
    F.IQ2_M: T.IQ2_S, F.IQ3_XXS: T.IQ3_XXS, F.IQ1_S: T.IQ1_S, F.IQ1_M: T.IQ1_M,
    F.IQ4_NL: T.IQ4_NL, F.IQ4_XS: T.IQ4_XS, F.IQ3_S: T.IQ3_S, F.IQ3_M: T.IQ3_S,
}  # fmt: skip
# ggml types llama.cpp has but gguf-py may not (Q1_0, Q2_0) are looked up by name.
for _name, _ft in (("Q1_0", F.Q1_0), ("Q2_0", F.Q2_0)):
    if hasattr(T, _name):
        _DEFAULT_TYPE[_ft] = getattr(T, _name)


def default_type(ftype: int) -> T | None:
    """``llama_ftype_get_default_type``: the base ggml type of a file type (None when unknown)."""
    return _DEFAULT_TYPE.get(ftype)


def parse_file_type(text: str) -> FileType | None:
    """llama-quantize's ``try_parse_ftype``: a name (case-insensitive) or a numeric id; None if neither."""
    upper = text.upper()
    for ft in FILE_TYPES:
        if ft.name == upper:
            return ft
    try:
        num = int(text.strip())  # std::stoi: leading blanks and a sign allowed
    except ValueError:
        m = re.match(r"\s*[+-]?\d+", text)
        if m is None:
            return None
        num = int(m.group())
    return next((ft for ft in FILE_TYPES if ft.ftype == num), None)


def parse_ggml_type(text: str) -> T | None:
    """llama-quantize's ``parse_ggml_type``: a ggml type name (``q8_0``, ``q5_k``, ``f16``), any case."""
    try:
        return T[text.upper()]
    except KeyError:
        return None
