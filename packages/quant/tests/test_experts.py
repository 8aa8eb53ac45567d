"""ExpertMatrix: every output row of a grouped product (one launch for all experts where the type has a
grouped kernel, one product per expert otherwise) equals the expert's own ExactMatrix product of the row's
token, in every kernel set the host runs, with experts whose rows are not whole tiles."""

from __future__ import annotations

import numpy as np
import pytest

import llama_quant
from gguf_io import GGMLQuantizationType as T
from llama_quant.cpu import KernelSet, host_kernel_set
from llama_quant.kernels import Activations, ExactMatrix, ExpertMatrix

KERNEL_SETS = [k for k in KernelSet if k <= host_kernel_set()]
COLS = 512
TYPES = [T.Q4_K, T.Q6_K, T.Q8_0, T.Q4_0, T.MXFP4, T.F16]


def _raw(rng: np.random.Generator, rows: int, qtype: T) -> np.ndarray:
    x = rng.standard_normal((rows, COLS)).astype(np.float32)
    return np.frombuffer(np.ascontiguousarray(llama_quant.quantize(x, qtype)).tobytes(), np.uint8)


def _grouping(selected: np.ndarray, n_expert: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """pairs (t * k + i) grouped by expert, their offsets, the active experts and their count."""
    order = np.argsort(selected.reshape(-1), kind="stable")
    counts = np.bincount(selected.reshape(-1), minlength=n_expert)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    active = np.zeros(n_expert, np.int64)
    live = np.flatnonzero(counts)
    active[: len(live)] = live
    return order.astype(np.int64), offsets, active, len(live)


@pytest.mark.parametrize("kernels", KERNEL_SETS, ids=lambda k: k.name.lower())
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [(64,), (40, 40), (96,)], ids=["tile", "stacked-padded", "padded"])
@pytest.mark.parametrize("n", [1, 5, 37])
def test_grouped_rows_equal_each_experts_product(
    kernels: KernelSet, qtype: T, rows: tuple[int, ...], n: int
) -> None:
    rng = np.random.default_rng(n * 7 + len(rows))
    n_expert, k = 6, 3
    raws = [[_raw(rng, r, qtype) for r in rows] for _ in range(n_expert)]
    parts = [(np.concatenate([raws[e][i] for e in range(n_expert)]), qtype, r) for i, r in enumerate(rows)]
    grouped = ExpertMatrix.stacked(parts, n_expert, COLS, kernels)
    assert grouped is not None and grouped.rows == sum(rows)
    assert grouped.grouped == (qtype in (T.Q4_K, T.Q6_K) and kernels is not KernelSet.PORTABLE)
    each = [ExactMatrix(np.concatenate(raws[e]), qtype, sum(rows), COLS, kernels) for e in range(n_expert)]
    selected = np.stack([rng.permutation(n_expert - 1)[:k] for _ in range(n)]).astype(np.int32)  # 5 unused
    pairs, offsets, active, m = _grouping(selected, n_expert)
    x = rng.standard_normal((n, COLS)).astype(np.float32)

    # gate/up: pair t * k + i reads token t's row
    out = np.full((n * k, grouped.rows), np.nan, np.float32)
    grouped.matmul(Activations(COLS, n).set(x), out, pairs, offsets, active, m, k)
    for t in range(n):
        for i in range(k):
            want = each[selected[t, i]].matvec(x[t])
            np.testing.assert_array_equal(out[t * k + i], want)

    # down: pair p reads its own row
    y = rng.standard_normal((n * k, COLS)).astype(np.float32)
    out2 = np.full((n * k, grouped.rows), np.nan, np.float32)
    grouped.matmul(Activations(COLS, n * k).set(y), out2, pairs, offsets, active, m, 1)
    for p in range(n * k):
        np.testing.assert_array_equal(out2[p], each[selected.reshape(-1)[p]].matvec(y[p]))


def test_mixed_parts_that_do_not_stack_and_bad_buffers() -> None:
    rng = np.random.default_rng(0)
    a = np.concatenate([_raw(rng, 64, T.Q4_K) for _ in range(2)])
    b = np.concatenate([_raw(rng, 64, T.Q8_0) for _ in range(2)])
    assert ExpertMatrix.stacked([(a, T.Q4_K, 64), (b, T.Q8_0, 64)], 2, COLS) is None
    m = ExpertMatrix.stacked([(a, T.Q4_K, 64)], 2, COLS)
    assert m is not None
    grouping = (np.zeros(1, np.int64), np.array([0, 1, 1], np.int64), np.zeros(2, np.int64), 1, 1)
    with pytest.raises(ValueError, match="expected 512"):
        m.matmul(Activations(256, 1), np.zeros((1, 64), np.float32), *grouping)
    with pytest.raises(ValueError, match="float32"):
        m.matmul(Activations(COLS, 1), np.zeros((1, 32), np.float32), *grouping)
    bad = (np.zeros(1, np.int64), np.array([0, 1, 5], np.int64), np.zeros(2, np.int64), 1, 1)  # 5 pairs
    with pytest.raises(ValueError, match="grouping"):
        m.matmul(Activations(COLS, 1), np.zeros((1, 64), np.float32), *bad)
    with pytest.raises(ValueError, match="grouping"):
        m.matmul(Activations(COLS, 1), np.zeros((1, 64), np.float32), *grouping[:3], 3, 1)  # 3 experts of 2
