"""The kernel set chosen at the edge: names, the environment variable, and refusals."""

from __future__ import annotations

import pytest
from llvmlite import binding as llvm

from llama_quant.cpu import ENV_VAR, KernelSet, cpu_has, host_kernel_set, resolve_kernel_set


def test_host_kernel_set_matches_the_features() -> None:
    host = llvm.get_host_cpu_features()
    has = lambda *names: all(host.get(n) for n in names)  # noqa: E731
    expected = KernelSet.PORTABLE
    if has("avx2", "f16c", "fma"):
        expected = KernelSet.AVX2
        if has("avx512f", "avx512bw", "avx512vl", "avx512vnni"):
            expected = KernelSet.AVX512
    assert host_kernel_set() is expected
    assert cpu_has() and cpu_has("avx2") == has("avx2")


@pytest.mark.parametrize("kernels", [k for k in KernelSet if k <= host_kernel_set()])
def test_names_and_members_resolve(kernels: KernelSet, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_kernel_set(kernels.name.lower()) is kernels
    assert resolve_kernel_set(f" {kernels.name} ") is kernels
    assert resolve_kernel_set(kernels) is kernels
    monkeypatch.setenv(ENV_VAR, kernels.name.lower())
    assert resolve_kernel_set(None) is kernels


def test_none_without_the_variable_is_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_kernel_set(None) is host_kernel_set()
    monkeypatch.setenv(ENV_VAR, "")
    assert resolve_kernel_set(None) is host_kernel_set()


def test_unknown_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"unknown kernel set 'sse9'.*portable, avx2, avx512"):
        resolve_kernel_set("sse9")
    monkeypatch.setenv(ENV_VAR, "neon")
    with pytest.raises(ValueError, match="unknown kernel set 'neon'"):
        resolve_kernel_set(None)


def test_a_set_the_host_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # an explicit numba target without AVX-512 makes the AVX-512 set unavailable on any x86 host
    import numba

    monkeypatch.setattr(numba.config, "CPU_FEATURES", "+avx2,+f16c,+fma", raising=False)
    assert host_kernel_set() is KernelSet.AVX2
    with pytest.raises(ValueError, match=r"avx512 needs CPU features avx512f, avx512bw.*runs up to avx2"):
        resolve_kernel_set("avx512")
