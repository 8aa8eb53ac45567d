"""The exact kernels against their numpy references (bit for bit), matmul against matvec, and a loose
float64 sanity check. No llama.cpp needed; the parity tests live in test_exact_parity.py."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest
from exact_cases import ACT_KINDS, TYPES, make_acts, weights
from gguf import GGMLQuantizationType as T
from iq_cases import IQ_TYPES, iq_weights

import llama_quant
from llama_quant.cpu import KernelSet, host_kernel_set
from llama_quant.kernels import SUPPORTED_TYPES, Activations, ExactMatrix, klanes, quads, ref
from llama_quant.kernels import act as _act

act: Any = _act  # numba dispatchers: mypy cannot see their signatures
KERNEL_SETS = [k for k in KernelSet if k <= host_kernel_set()]  # every set this host runs
_ids = lambda k: k.name  # noqa: E731


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("kind", ACT_KINDS)
def test_activation_quantizers_match_reference(kind: str) -> None:
    n, cols = 3, 768
    x = make_acts(kind, n, cols)
    q8 = [(cols, np.int8), (cols // 32, np.float32), (cols // 32, np.float32), (cols // 16, np.int32)]
    q8k = [(cols, np.int8), (cols // 256, np.float32), (cols // 16, np.int32)]
    for fn, rfn, shapes in (
        (act.quantize_q8, ref.quantize_q8, q8),
        (act.quantize_q8_rows, ref.quantize_q8, q8),  # the threaded form, for many tokens
        (act.quantize_q8_k, ref.quantize_q8_k, q8k),
        (act.quantize_q8_k_rows, ref.quantize_q8_k, q8k),
        (act.quantize_f16, ref.quantize_f16, [(cols, np.float32)]),
        (act.quantize_bf16, ref.quantize_bf16, [(cols, np.float32)]),
    ):
        got = [np.zeros((n, c), dt) for c, dt in shapes]
        want = [np.zeros((n, c), dt) for c, dt in shapes]
        fn(*got, x, n, cols)
        cast(Any, rfn)(*want, x, n, cols)
        for g, w in zip(got, want, strict=True):
            assert _same(g, w), str(fn)


def test_f16_round_matches_numpy() -> None:
    rng = np.random.default_rng(3)
    v = np.concatenate(
        [
            rng.standard_normal(20000).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 6, 20000),
            np.array(
                [
                    0.0,
                    -0.0,
                    65504.0,
                    65519.996,
                    65520.0,
                    1e9,
                    6.1035156e-05,
                    5.9604645e-08,
                    2.9802322e-08,
                    2.9802326e-08,
                    1.0 + 2.0**-11,
                    1.0 + 3 * 2.0**-11,
                ],
                np.float32,
            ),
        ]
    ).astype(np.float32)
    got = np.array([act.f16_round(np.float32(a)) for a in v], np.float32)
    with np.errstate(over="ignore"):
        want = v.astype(np.float16).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_f16_activations_of_any_bits_match_numpy() -> None:
    """``quantize_f16``'s bit arithmetic against numpy's conversion over random f32 bit patterns (every
    exponent: subnormals, fp16's normal and overflow edges, inf, nan) and each rounding boundary."""
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    edges = np.array(
        [0x38800000, 0x387FFFFF, 0x33000000, 0x33000001, 0x477FEFFF, 0x477FF000, 0x7F800000], np.uint32
    )
    bits = np.concatenate(
        [bits, edges, edges | np.uint32(0x80000000), np.arange(0x3F800000, 0x3F804000 - 14, dtype=np.uint32)]
    )
    x = bits.view(np.float32).reshape(-1, 64)
    got = np.zeros_like(x)
    act.quantize_f16(got, x, x.shape[0], 64)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    nan = np.isnan(x)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("kernels", KERNEL_SETS, ids=_ids)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("kind", ["normal", "outliers", "zeros", "ties"])
def test_kernel_matches_reference(qtype: T, kind: str, kernels: KernelSet) -> None:
    rows, cols = 70, 512  # a partial last tile
    raw = weights(qtype, rows, cols, seed=int(qtype))
    m = ExactMatrix(raw, qtype, rows, cols, kernels)
    assert m.kernels is kernels
    x = make_acts(kind, 17, cols, seed=int(qtype))
    for n in (1, 2, 5, 17):
        want = np.empty((n, rows), np.float32)
        ref.matmul(want, raw, qtype, rows, cols, x[:n])
        assert _same(m.matmul(x[:n]), want), n
        assert _same(m.matvec(x[n - 1]), want[n - 1]), n


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_batch_invariance_and_shared_activations(qtype: T) -> None:
    rows, cols = 130, 768
    raw = weights(qtype, rows, cols, seed=1)
    m = ExactMatrix(raw, qtype, rows, cols)
    x = make_acts("mixed", 9, cols, seed=2)
    full = m.matmul(x)
    for a, b in ((0, 1), (1, 4), (4, 9)):
        assert _same(m.matmul(x[a:b]), full[a:b])
    acts = m.quantize_input(x)
    assert _same(m.matmul(acts), full)
    other = ExactMatrix(weights(T.Q8_0, 64, cols, seed=5), T.Q8_0, 64, cols)
    assert _same(other.matmul(acts), other.matmul(x))  # a matrix of another type converts on first use
    one = Activations(cols, 4).set(x[3])
    out = np.empty(rows, np.float32)
    assert m.matvec(one, out) is out
    assert _same(out, full[3])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_close_to_float64_product(qtype: T) -> None:
    rows, cols = 64, 1024
    raw = weights(qtype, rows, cols, seed=0)
    w = llama_quant.dequantize(raw, qtype, (rows, cols)).astype(np.float64)
    x = make_acts("normal", 3, cols)
    y = ExactMatrix(raw, qtype, rows, cols).matmul(x)
    exact = x.astype(np.float64) @ w.T
    # activations are quantized (8 bits: about 1% of each value; f16 / bf16 rounding; f32 none)
    rel = {T.F32: 1e-6, T.F16: 2e-3, T.BF16: 1e-2}.get(qtype, 4e-2)
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T
    assert np.all(np.abs(y - exact) <= rel * scale + 1e-6)


@pytest.mark.parametrize(
    "parts",
    [[T.Q5_0, T.Q5_0, T.Q8_0], [T.Q8_0, T.Q5_0], [T.Q5_0, T.Q5_0], [T.Q4_K, T.Q4_K], [T.Q4_1]],
    ids=lambda p: "+".join(t.name for t in p),
)
def test_stacked_rows_equal_each_matrix(parts: list[T]) -> None:
    """Matrices stacked by rows (one launch) give each part's own numbers; Q5_0 stacks with Q8_0."""
    cols = 512
    shapes = [
        (qtype, 64 * i + 40, weights(qtype, 64 * i + 40, cols, seed=i)) for i, qtype in enumerate(parts)
    ]
    m = ExactMatrix.stacked([(raw, qtype, rows) for qtype, rows, raw in shapes], cols)
    assert m is not None and m.rows == sum(rows for _, rows, _ in shapes)
    x = make_acts("mixed", 5, cols, seed=7)
    full, one = m.matmul(x), m.matvec(x[2])
    r0 = 0
    for qtype, rows, raw in shapes:
        part = ExactMatrix(raw, qtype, rows, cols).matmul(x)
        assert _same(full[:, r0 : r0 + rows], part) and _same(one[r0 : r0 + rows], part[2])
        r0 += rows


@pytest.mark.parametrize("kernels", KERNEL_SETS, ids=_ids)
@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES, key=lambda t: t.name), ids=lambda t: t.name)
def test_chunked_repacking_equals_the_whole_matrix(
    qtype: T, kernels: KernelSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A matrix repacked a chunk of tiles at a time (to bound the load's temporaries) holds the very arrays
    of one repack of all its rows, whatever the chunk, with a last tile part-filled; its products too."""
    from llama_quant.kernels import matrix

    rows, cols = 64 * 5 + 23, 512
    raw = weights(qtype, rows, cols, seed=3) if qtype in TYPES else iq_weights(qtype, rows, cols, seed=3)
    spec = matrix._SPECS[kernels][qtype]
    whole = spec.pack(raw.reshape(rows, -1), rows, cols)
    row_bytes = raw.size // rows
    x = make_acts("mixed", 3, cols, seed=5)
    reference = ExactMatrix(raw, qtype, rows, cols, kernels=kernels).matmul(x)
    for tiles in (1, 2, 4):
        monkeypatch.setattr(matrix, "PACK_CHUNK_BYTES", tiles * 64 * row_bytes)
        chunked = matrix._pack_by_chunks(spec.pack, raw.reshape(rows, -1), rows, cols)
        assert len(chunked) == len(whole)
        for a, b in zip(chunked, whole, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()
        m = ExactMatrix(raw, qtype, rows, cols, kernels=kernels)
        assert _same(m.matmul(x), reference)


def test_stacked_refuses_other_kernels_and_bad_sizes() -> None:
    cols = 256
    q4k, q8 = weights(T.Q4_K, 64, cols), weights(T.Q8_0, 64, cols)
    assert ExactMatrix.stacked([(q4k, T.Q4_K, 64), (q8, T.Q8_0, 64)], cols) is None
    with pytest.raises(ValueError, match="Q5_0"):
        ExactMatrix.stacked([(q8, T.Q8_0, 64), (q8[:-1], T.Q5_0, 64)], cols)


def test_errors() -> None:
    with pytest.raises(ValueError, match="bytes"):
        ExactMatrix(np.zeros(10, np.uint8), T.Q4_0, 4, 32)
    with pytest.raises(ValueError, match="divisible"):
        ExactMatrix(np.zeros(10, np.uint8), T.Q4_K, 4, 32)
    with pytest.raises(ValueError, match="no exact kernel"):
        ExactMatrix(np.zeros(10, np.uint8), T.Q8_K, 4, 32)
    m = ExactMatrix(np.zeros(4 * 18, np.uint8), T.Q4_0, 4, 32)
    with pytest.raises(ValueError, match="columns"):
        m.matmul(Activations(64, 1).set(np.zeros(64, np.float32)))
    assert m.nbytes > 0 and m.activation_format == "q8" and m.vec_dot_type == T.Q8_0
    assert set(TYPES) | set(IQ_TYPES) == SUPPORTED_TYPES


def test_a_kernel_set_the_host_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import numba

    monkeypatch.setattr(numba.config, "CPU_FEATURES", "+sse2", raising=False)  # a target without AVX2
    with pytest.raises(ValueError, match="kernel set avx2 needs CPU features avx2, f16c, fma"):
        ExactMatrix(np.zeros(4 * 18, np.uint8), T.Q4_0, 4, 32, KernelSet.AVX2)
    assert ExactMatrix(np.zeros(4 * 18, np.uint8), T.Q4_0, 4, 32).kernels is KernelSet.PORTABLE


def test_the_environment_variable_chooses_the_kernel_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_KERNELS", "portable")
    assert ExactMatrix(np.zeros(4 * 18, np.uint8), T.Q4_0, 4, 32).kernels is KernelSet.PORTABLE
    monkeypatch.delenv("LLAMA_KERNELS")
    assert ExactMatrix(np.zeros(4 * 18, np.uint8), T.Q4_0, 4, 32).kernels is host_kernel_set()


@pytest.mark.parametrize("kernels", KERNEL_SETS, ids=_ids)
@pytest.mark.parametrize(
    "qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K, T.F16], ids=lambda t: t.name
)
def test_many_token_path_equals_one_token_products(qtype: T, kernels: KernelSet) -> None:
    """Batches of these types change kernels with the token count (``pairs``' Q5 unpacking, ``quads`` from
    ``QUAD_TOKENS``, activations rearranged on all threads from 16, ``halves``' passes of four tokens): the same numbers as the reference and
    as one matvec per token, with a partial last tile and extreme activations."""
    rows, cols = 200, 512
    raw = weights(qtype, rows, cols, seed=3)
    m = ExactMatrix(raw, qtype, rows, cols, kernels)
    for kind, n in (("mixed", 37), ("outliers", 16), ("ties", 8), ("normal", 4), ("ties", 3)):
        x = make_acts(kind, n, cols, seed=n)
        full = m.matmul(x)
        want = np.empty((n, rows), np.float32)
        ref.matmul(want, raw, qtype, rows, cols, x)
        assert _same(full, want)
        for t in range(n):
            assert _same(m.matvec(x[t]), full[t])


@pytest.mark.parametrize("kernels", KERNEL_SETS, ids=_ids)
@pytest.mark.parametrize("qtype", [T.Q5_0, T.Q5_1], ids=lambda t: t.name)
def test_q5_extreme_values_fit_the_int16_sums(qtype: T, kernels: KernelSet) -> None:
    """Every value at 31 (all fifth bits set) or 0 against activations at +-127: the largest pair sums
    the byte-pair kernel adds in int16, and every fifth-bit plane position."""
    rows, cols = 70, 256
    raw = weights(qtype, rows, cols, seed=1).reshape(rows, cols // 32, -1).copy()
    head = 2 if qtype == T.Q5_0 else 4  # d (and m), then qh, then qs
    raw[: rows // 2, :, head:] = 0xFF
    raw[rows // 2 :, :, head:] = 0
    raw[rows // 2 :, 1::2, head : head + 4] = np.array([0x55, 0xAA, 0x0F, 0xF0], np.uint8)
    raw = raw.reshape(-1)
    m = ExactMatrix(raw, qtype, rows, cols, kernels)
    x = np.full((3, cols), 1000.0, np.float32)
    x[1] = -1000.0
    x[2, ::2] = -1000.0
    want = np.empty((3, rows), np.float32)
    ref.matmul(want, raw, qtype, rows, cols, x)
    assert _same(m.matmul(x), want)
    assert _same(m.matvec(x[2]), want[2])


@pytest.mark.parametrize("kernels", KERNEL_SETS, ids=_ids)
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q8_0], ids=lambda t: t.name)
def test_extreme_values_fit_the_integer_sums(qtype: T, kernels: KernelSet) -> None:
    """The largest integer sums of a block: every value at its top or bottom (Q8_0: -128, which the quads'
    unsigned bytes hold as 0, and 127) against activations at +-127, for one token and for a prompt's path
    (``quads`` from ``QUAD_TOKENS`` tokens on, with VNNI)."""
    rows, cols = 70, 256
    raw = weights(qtype, rows, cols, seed=1).reshape(rows, cols // 32, -1).copy()
    head = {T.Q4_0: 2, T.Q4_1: 4, T.Q8_0: 2}[qtype]  # d (and m), then the quants
    raw[: rows // 2, :, head:] = 0x80 if qtype == T.Q8_0 else 0xFF
    raw[rows // 2 :, :, head:] = 0x7F if qtype == T.Q8_0 else 0
    raw[rows // 2 :, 1::2, head : head + 4] = np.array([0x55, 0xAA, 0x0F, 0xF0], np.uint8)
    raw = raw.reshape(-1)
    m = ExactMatrix(raw, qtype, rows, cols, kernels)
    x = np.full((quads.QUAD_TOKENS + 1, cols), 1000.0, np.float32)
    x[1] = -1000.0
    x[2, ::2] = -1000.0
    want = np.empty((len(x), rows), np.float32)
    ref.matmul(want, raw, qtype, rows, cols, x)
    assert _same(m.matmul(x), want)
    for t in range(len(x)):
        assert _same(m.matvec(x[t]), want[t])


_AVX2_CHILD = """
import numpy as np
from exact_cases import make_acts, weights
from gguf import GGMLQuantizationType as T
from llama_quant.cpu import KernelSet, host_kernel_set
from llama_quant.kernels import ExactMatrix, ref

assert host_kernel_set() is KernelSet.AVX2, "not an AVX2-only target"
for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K, T.F16):
    rows, cols = 70, 512
    raw = weights(qtype, rows, cols, seed=int(qtype))
    m = ExactMatrix(raw, qtype, rows, cols)
    for n in (1, 2, 5, 17):
        x = make_acts("outliers", n, cols, seed=n)
        want = np.empty((n, rows), np.float32)
        ref.matmul(want, raw, qtype, rows, cols, x)
        assert np.array_equal(m.matmul(x), want), (qtype.name, n)
        assert np.array_equal(m.matvec(x[-1]), want[-1]), (qtype.name, n)
print("checked")
"""
_AVX2_FEATURES = ("sse", "sse2", "sse3", "ssse3", "sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "bmi", "bmi2",
                  "popcnt", "lzcnt", "movbe", "cx16", "xsave", "fxsr", "cmov")  # fmt: skip


def test_byte_pair_kernels_on_an_avx2_only_target() -> None:
    """The byte-pair kernels as a CPU with AVX2 and no AVX-512 compiles and runs them, whatever this host
    has: a child process with numba's target set to such a CPU, where the AVX2 set is the default (no
    AVX-512 instruction may reach its code, which the AVX2 set on an AVX-512 host cannot show)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import llvmlite.binding as llvm

    host = llvm.get_host_cpu_features()
    if not (host.get("avx2") and host.get("f16c") and host.get("fma")):
        pytest.skip("this CPU cannot run AVX2 code")
    features = ",".join(f"+{f}" for f in _AVX2_FEATURES if host.get(f))
    env = {**os.environ, "NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": features}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    child = subprocess.run([sys.executable, "-c", _AVX2_CHILD], env=env, capture_output=True, text=True)
    assert child.returncode == 0 and child.stdout.strip() == "checked", child.stderr[-2000:]


_LANES_CHILD = """
import numpy as np
from exact_cases import make_acts, weights
from gguf import GGMLQuantizationType as T
from llama_quant.cpu import KernelSet
from llama_quant.kernels import ExactMatrix, ref

for kernels in ({order}):
    for qtype in (T.Q4_K, T.Q6_K):
        raw = weights(qtype, 70, 512, seed=int(qtype))
        x = make_acts("outliers", 5, 512, seed=5)
        want = np.empty((5, 70), np.float32)
        ref.matmul(want, raw, qtype, 70, 512, x)
        assert np.array_equal(ExactMatrix(raw, qtype, 70, 512, kernels).matmul(x), want), (kernels, qtype)
print("checked")
"""


@pytest.mark.skipif(host_kernel_set() < KernelSet.AVX512, reason="needs a CPU that runs both lane widths")
@pytest.mark.parametrize("order", ["KernelSet.AVX512, KernelSet.AVX2", "KernelSet.AVX2, KernelSet.AVX512"])
def test_both_lane_widths_keep_their_own_cached_code(order: str) -> None:
    """The K types' 256- and 512-bit lane kernels are two compiled functions with two cache entries: fresh
    processes that load them from numba's cache, in either order, each get ggml's numbers (one shared
    cache entry would hand one width the other's machine code)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    assert klanes.mm_k256 is not klanes.mm_k512
    assert klanes.mm_k256.py_func.__qualname__ != klanes.mm_k512.py_func.__qualname__
    env = {**os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    for _ in range(2):  # the first child may compile; the second loads both from the cache
        code = _LANES_CHILD.format(order=order)
        child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert child.returncode == 0 and child.stdout.strip() == "checked", child.stderr[-2000:]
