"""The grid i-quant quantizers without llama.cpp: their search tables, what they keep of the weights, the
refusal without importance weights, and llama-quant's progress output (the bytes against llama.cpp are in
test_iq_quantize_parity.py)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from conftest import make_imatrix, make_matrix

import llama_quant as lq
from gguf_io import GGMLQuantizationType as T
from llama_quant.formats.iq_grid_init import grid_tables
from llama_quant.progress import TensorProgress

GRID_TYPES = [T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S]
# relative RMS error bounds on Gaussian weights (measured about 0.6x of these)
_RMSE = {
    T.IQ1_S: 0.75,
    T.IQ1_M: 0.65,
    T.IQ2_XXS: 0.5,
    T.IQ2_XS: 0.45,
    T.IQ2_S: 0.4,
    T.IQ3_XXS: 0.3,
    T.IQ3_S: 0.25,
}


@pytest.mark.parametrize("qtype", [T.IQ2_XXS, T.IQ3_S, T.IQ1_S], ids=lambda t: t.name)
def test_grid_tables(qtype):
    grid, kmap, neighbours = grid_tables(qtype)
    bits = 3 if grid.shape[1] == 4 else 2
    on = np.flatnonzero(kmap >= 0)
    assert on.size == grid.shape[0]
    # an entry's own levels index it
    levels = (grid.astype(np.int64) - 1) // 2
    packed = (levels << (bits * np.arange(grid.shape[1]))).sum(axis=1)
    assert np.array_equal(kmap[packed], np.arange(grid.shape[0]))
    # every other index lists its nearest entries, nearest first
    rng = np.random.default_rng(0)
    for u in rng.choice(np.flatnonzero(kmap < 0), 50, replace=False):
        off = -kmap[u] - 1
        listed = neighbours[off + 1 : off + 1 + neighbours[off]].astype(np.int64)
        pos = 2 * ((u >> (bits * np.arange(grid.shape[1]))) & ((1 << bits) - 1)) + 1
        d2 = ((grid.astype(np.int64) - pos) ** 2).sum(axis=1)
        assert listed.size > 0 and d2[listed[0]] == d2.min()
        assert np.all(np.diff(d2[listed]) >= 0)
    assert grid_tables(qtype) is grid_tables(qtype)  # computed once


@pytest.mark.parametrize("qtype", GRID_TYPES, ids=lambda t: t.name)
def test_quantized_weights_stay_close(qtype):
    x = make_matrix("normal", 4, 512, seed=2)
    raw = lq.quantize(x, qtype, imatrix=make_imatrix(512, seed=2))
    assert raw.size == 4 * lq.row_nbytes(qtype, 512)
    back = lq.dequantize(raw, qtype, x.shape)
    rel = np.sqrt(np.mean((back - x) ** 2) / np.mean(x**2))
    assert rel < _RMSE[qtype], rel
    zeros = lq.quantize(np.zeros((1, 256), np.float32), qtype, imatrix=np.ones(256, np.float32))
    assert not lq.dequantize(zeros, qtype, (1, 256)).any()


@pytest.mark.parametrize("qtype", [T.IQ2_XXS, T.IQ2_XS, T.IQ1_S], ids=lambda t: t.name)
def test_refused_without_importance_weights(qtype):
    with pytest.raises(ValueError, match=f"quantizing to {qtype.name} requires an importance matrix"):
        lq.quantize(make_matrix("normal", 1, 256), qtype)


def test_progress_lines_and_bar():
    lines: list[str] = []
    bar = io.StringIO()
    p = TensorProgress(lines.append, total_mib=3.0, stream=bar, tty=True)
    p("[   1/   2] a.weight - [  256,     1], type =    f32, size =    1.000 MiB")
    assert "tensor 1/2" in bar.getvalue() and " 33.3%" in bar.getvalue()
    p(
        "[   2/   2] b.weight - [  256,   256], type =    f32, converting to iq2_s .. size =  2.00 MiB ->  0.1 MiB"
    )
    p.close()
    assert "100.0%  tensor 2/2" in bar.getvalue() and bar.getvalue().endswith("\r\033[K")
    assert [s[:11] for s in lines] == ["[   1/   2]", "[   2/   2]"]
    plain = io.StringIO()
    q = TensorProgress(lines.append, total_mib=3.0, stream=plain, tty=False)
    q("[   1/   2] a.weight - [  256,     1], type =    f32, size =    1.000 MiB")
    q.close()
    assert plain.getvalue() == "" and len(lines) == 3
