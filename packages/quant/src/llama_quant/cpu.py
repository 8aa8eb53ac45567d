"""What the CPU (and numba's target) can run, and the kernel set chosen from it.

The kernel set is decided once, at an edge (a model's load, a config field or ``LLAMA_KERNELS``), and passed
down to the kernels: every set the host can run is then reachable on it, so each is testable there.
"""

from __future__ import annotations

import enum
import functools
import os

import numba
from llvmlite import binding as llvm

__all__ = [
    "ENV_VAR",
    "EXACT_ENV_VAR",
    "KernelSet",
    "cpu_has",
    "host_kernel_set",
    "resolve_exact_floats",
    "resolve_kernel_set",
]

ENV_VAR = "LLAMA_KERNELS"
EXACT_ENV_VAR = "LLAMA_EXACT_FLOATS"


def cpu_has(*names: str) -> bool:
    """Whether numba's target has every CPU feature in ``names`` (LLVM's names: "avx2", "avx512bw", ...)."""
    features = getattr(numba.config, "CPU_FEATURES", None)
    if features:  # an explicit numba target
        listed = str(features).split(",")
        return all(f"+{name}" in listed for name in names)
    cpu = getattr(numba.config, "CPU_NAME", None)
    host = _host_features()
    return bool(cpu in (None, "host") and all(host.get(name) for name in names))


@functools.cache
def _host_features() -> dict[str, bool]:
    """The host CPU's features (asked of LLVM once: each query takes ~0.3 ms, and a load asks hundreds)."""
    return dict(llvm.get_host_cpu_features())


class KernelSet(enum.IntEnum):
    """The kernels a matrix runs; each set needs the CPU features of the ones below it and its own."""

    PORTABLE = 0  # plain loops LLVM vectorizes for any target (``blocks32``, ``kquants``, ``floats``)
    AVX2 = 1  # byte-pair multiply-adds on 256-bit vectors (``pairs``, 256-bit K-type lanes), F16 ``halves``
    AVX512 = 2  # VNNI 4-byte dot products (``quads``) and 512-bit K-type lanes


# LLVM feature names each set needs beyond the sets below it
_NEEDS: dict[KernelSet, tuple[str, ...]] = {
    KernelSet.PORTABLE: (),
    KernelSet.AVX2: ("avx2", "f16c", "fma"),
    KernelSet.AVX512: ("avx512f", "avx512bw", "avx512vl", "avx512vnni"),
}


def _features(kernels: KernelSet) -> tuple[str, ...]:
    return tuple(name for k in KernelSet if k <= kernels for name in _NEEDS[k])


def host_kernel_set() -> KernelSet:
    """The best kernel set this CPU (and numba's target) runs."""
    best = KernelSet.PORTABLE
    for k in KernelSet:
        if cpu_has(*_features(k)):
            best = k
    return best


def resolve_kernel_set(choice: str | KernelSet | None) -> KernelSet:
    """The kernel set to use: ``choice`` ("portable" | "avx2" | "avx512" or a ``KernelSet``), else the
    ``LLAMA_KERNELS`` environment variable if set, else the host's best. Raises ``ValueError`` if the name is
    unknown or the set needs CPU features the host lacks."""
    if choice is None:
        choice = os.environ.get(ENV_VAR) or None
        if choice is None:
            return host_kernel_set()
    if isinstance(choice, str):
        try:
            kernels = KernelSet[choice.strip().upper()]
        except KeyError:
            names = ", ".join(k.name.lower() for k in KernelSet)
            raise ValueError(f"unknown kernel set {choice!r}: expected one of {names}") from None
    else:
        kernels = KernelSet(choice)
    host = host_kernel_set()
    if kernels > host:
        missing = [name for name in _features(kernels) if not cpu_has(name)]
        raise ValueError(
            f"kernel set {kernels.name.lower()} needs CPU features {', '.join(missing)}, which this host "
            f"(or numba's target) lacks; it runs up to {host.name.lower()}"
        )
    return kernels


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def resolve_exact_floats(choice: bool | None) -> bool:
    """Whether F16, BF16 and F32 weights run the exact kernels (``floats``, ``halves``: f64 sums, the bits of
    llama.cpp's portable build) instead of the fast ones (``fast_floats``: f32 sums in vector lanes, as its
    native build): ``choice`` if given, else the ``LLAMA_EXACT_FLOATS`` environment variable ("1", "true",
    "yes", "on" or their opposites), else False. The quantized types always run their exact integer kernels."""
    if choice is not None:
        return bool(choice)
    value = os.environ.get(EXACT_ENV_VAR, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{EXACT_ENV_VAR}={value!r}: expected 1/true/yes/on or 0/false/no/off")
