"""The block-format registry: one declaration per ggml type, keyed by ``gguf.GGMLQuantizationType``.

A format module declares::

    class Q4_0(BlockFormat, qtype=GGMLQuantizationType.Q4_0):
        quantize_kernel = staticmethod(quantize_q4_0)  # numba, in the same module
        quantize_ref = staticmethod(ref.quantize_q4_0)  # plain numpy, llama_quant.formats.ref
        dequantize_kernel = staticmethod(dequantize_q4_0)
        dequantize_ref = staticmethod(ref.dequantize_q4_0)

and is then found by :func:`get_format`. Kernel signatures (numba kernel and numpy reference alike):

- ``quantize(x, qw, nrows, ncols, out)``: ``x`` float32[nrows * ncols] (ggml rows), ``qw`` float32[ncols]
  importance weights or float32[0] for none, ``out`` uint8[nrows * row_nbytes]; the same bytes as
  ``ggml_quantize_chunk``.
- ``dequantize(raw, n, out)``: ``raw`` uint8[n / block_size * type_size], ``out`` float32[n].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

__all__ = [
    "BlockFormat",
    "QTypeLike",
    "UnsupportedTypeError",
    "dequantize_types",
    "get_format",
    "quantize_types",
    "registered_formats",
    "resolve_qtype",
]

QTypeLike = GGMLQuantizationType | int | str

_FORMATS: dict[GGMLQuantizationType, type[BlockFormat]] = {}


class UnsupportedTypeError(ValueError):
    """A ggml type that the registry has no (quantize or dequantize) implementation for."""


class BlockFormat:
    """Base of every format declaration; subclasses register themselves with ``qtype=``."""

    qtype: ClassVar[GGMLQuantizationType]
    block_size: ClassVar[int]
    type_size: ClassVar[int]
    # True when llama.cpp refuses to quantize to this type without an importance matrix
    requires_imatrix: ClassVar[bool] = False
    quantize_kernel: ClassVar[Callable[..., Any] | None] = None
    quantize_ref: ClassVar[Callable[..., Any] | None] = None
    dequantize_kernel: ClassVar[Callable[..., Any] | None] = None
    dequantize_ref: ClassVar[Callable[..., Any] | None] = None

    def __init_subclass__(cls, qtype: GGMLQuantizationType, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if qtype in _FORMATS:
            raise TypeError(
                f"{qtype.name} is registered twice ({_FORMATS[qtype].__qualname__}, {cls.__qualname__})"
            )
        cls.qtype = qtype
        cls.block_size, cls.type_size = GGML_QUANT_SIZES[qtype]
        _FORMATS[qtype] = cls

    @classmethod
    def can_quantize(cls) -> bool:
        return cls.quantize_kernel is not None

    @classmethod
    def can_dequantize(cls) -> bool:
        return cls.dequantize_kernel is not None


def resolve_qtype(qtype: QTypeLike) -> GGMLQuantizationType:
    """Accept a GGMLQuantizationType, its integer value or its case-insensitive name ("q4_k")."""
    if isinstance(qtype, GGMLQuantizationType):
        return qtype
    if isinstance(qtype, str):
        try:
            return GGMLQuantizationType[qtype.strip().upper()]
        except KeyError:
            raise UnsupportedTypeError(
                f"unknown ggml type name {qtype!r}; known: {', '.join(t.name for t in GGMLQuantizationType)}"
            ) from None
    if isinstance(qtype, int) and not isinstance(qtype, bool):
        try:
            return GGMLQuantizationType(qtype)
        except ValueError:
            raise UnsupportedTypeError(f"unknown ggml type id {qtype}") from None
    raise TypeError(f"expected a GGMLQuantizationType, int or str, got {type(qtype).__name__}")


def _names(types: list[GGMLQuantizationType]) -> str:
    return ", ".join(t.name for t in types)


def get_format(qtype: QTypeLike, *, quantize: bool = False, dequantize: bool = False) -> type[BlockFormat]:
    """The registered format of ``qtype``; with ``quantize``/``dequantize`` it must support that direction."""
    t = resolve_qtype(qtype)
    fmt = _FORMATS.get(t)
    if fmt is None or (quantize and not fmt.can_quantize()) or (dequantize and not fmt.can_dequantize()):
        if quantize:
            raise UnsupportedTypeError(
                f"quantizing to {t.name} is not supported; supported: {_names(quantize_types())}"
            )
        if dequantize:
            raise UnsupportedTypeError(
                f"dequantizing {t.name} is not supported; supported: {_names(dequantize_types())}"
            )
        raise UnsupportedTypeError(
            f"{t.name} is not a supported block format; supported: {_names(sorted(_FORMATS))}"
        )
    return fmt


def registered_formats() -> dict[GGMLQuantizationType, type[BlockFormat]]:
    """A copy of the registry, in type-id order."""
    return dict(sorted(_FORMATS.items()))


def quantize_types() -> list[GGMLQuantizationType]:
    return [t for t, f in sorted(_FORMATS.items()) if f.can_quantize()]


def dequantize_types() -> list[GGMLQuantizationType]:
    return [t for t, f in sorted(_FORMATS.items()) if f.can_dequantize()]
