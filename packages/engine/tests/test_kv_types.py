"""KV cache types: llama.cpp's rules, the stored rows, the typed attention kernels against the f16/f32 ones
and llama-quant's vec_dot, the Walsh-Hadamard rotation, slot files and context shift with block types."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numba
import numpy as np
import pytest
import tiny_models
from tiny_models import write_tiny_model

from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams, StateFileError
from llama_engine.kv_types import (
    KV_TYPES,
    decode_rows,
    encode_rows,
    kv_type,
    resolve_flash_attn,
    rotation_sizes,
)
from llama_engine.ops import attention, attention_typed, kv_dots
from llama_engine.ops import flash_attn as fa
from llama_engine.requests import FinalEvent, TokenEvent
from llama_quant.kernels import ref

BLOCK_TYPES = ["q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


def test_the_reference_type_list() -> None:
    assert list(KV_TYPES) == ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
    with pytest.raises(ValueError, match=r"Unsupported cache type: q2_k \(allowed values: f32, f16"):
        kv_type("q2_k")
    assert kv_type("q8_0").row_bytes(64) == 68 and kv_type("bf16").row_bytes(64) == 128


def test_flash_attention_rules() -> None:
    assert resolve_flash_attn("auto", "f16", "f16", 64) is False  # the engine's default path
    assert resolve_flash_attn("auto", "q8_0", "f16", 64) is False  # a quantized K alone: mul_mat
    assert resolve_flash_attn("auto", "f16", "q4_0", 64) is True  # a quantized V turns it on
    assert resolve_flash_attn("on", "f32", "f32", 16) is True
    with pytest.raises(ValueError, match="quantized V cache requires flash_attn to be enabled"):
        resolve_flash_attn("off", "f16", "q8_0", 64)
    with pytest.raises(
        ValueError, match="V cache type q8_0 with block size 32 does not divide n_embd_head_v=16"
    ):
        resolve_flash_attn("on", "f16", "q8_0", 16)
    with pytest.raises(ValueError, match="K cache type q4_0 with block size 32 does not divide"):
        resolve_flash_attn("off", "q4_0", "f16", 16)
    with pytest.raises(ValueError, match="unknown value for --flash-attn: 'yes'"):
        resolve_flash_attn("yes", "f16", "f16", 64)


def test_rotation_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert rotation_sizes("f16", "f16", 64) == (0, 0)
    assert rotation_sizes("q8_0", "f16", 64) == (64, 0)
    assert rotation_sizes("q8_0", "q4_0", 128) == (128, 64)  # K: the largest power of two dividing
    assert rotation_sizes("q8_0", "q8_0", 96) == (0, 0)  # not a multiple of 64
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    assert rotation_sizes("q8_0", "q8_0", 64) == (0, 0)


def test_fwht_is_the_orthonormal_hadamard_transform() -> None:
    n = 64
    h = np.array([[1.0]])
    while len(h) < n:
        h = np.block([[h, h], [h, -h]])
    x = np.random.default_rng(0).standard_normal((3, 2 * n)).astype(np.float32)
    y = x.copy()
    fa.fwht_rows(y, 3, 0, 2 * n, n)
    expect = np.concatenate([x[:, :n] @ h.T, x[:, n:] @ h.T], axis=1) / np.sqrt(n)
    np.testing.assert_allclose(y, expect, rtol=0, atol=1e-5)
    fa.fwht_rows(y, 3, 0, 2 * n, n)  # its own inverse
    np.testing.assert_allclose(y, x, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["bf16", *BLOCK_TYPES])
def test_rows_round_trip(name: str) -> None:
    t = kv_type(name)
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    raw = encode_rows(t, x)
    assert raw.shape == (4, t.row_bytes(64)) and raw.dtype == np.uint8
    back = decode_rows(t, raw, 64)
    assert np.abs(back - x).max() < (0.02 if name in ("bf16", "q8_0") else 0.5)
    assert np.array_equal(encode_rows(t, back), raw) or name in ("q4_1", "q5_1", "iq4_nl")


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_block_dots_are_llama_quants_vec_dot(name: str) -> None:
    """K.Q of every head of a cache row equals llama-quant's exact product (ggml's vec_dot)."""
    t = kv_type(name)
    rng = np.random.default_rng(2)
    head_dim, n_head = 64, 2
    k = rng.standard_normal((5, n_head * head_dim)).astype(np.float32)
    q = rng.standard_normal((1, n_head * head_dim)).astype(np.float32)
    raw = encode_rows(t, k)
    qr, xq, xd, xs, xsum = fa._ready(q, 1, n_head * head_dim, t.code)
    sc = fa._make_scratch.py_func(head_dim)
    for h in range(n_head):
        ko = h * t.row_bytes(head_dim)
        got = [
            fa._kq(raw[c], ko, t.code, head_dim, qr, xq, xd, xs, xsum, 0, h * head_dim, sc) for c in range(5)
        ]
        head = np.ascontiguousarray(raw[:, ko : ko + t.row_bytes(head_dim)]).reshape(-1)
        expect = np.zeros(5, np.float32)
        ref.matvec(expect, head, t.qtype, 5, head_dim, q[0, h * head_dim : (h + 1) * head_dim])
        assert np.array_equal(np.array(got, np.float32), expect)


def test_iq4_nl_levels_are_the_table() -> None:
    from llama_quant.formats.iq4 import KVALUES_IQ4NL

    got = [int(kv_dots.iq4nl_level.py_func(np.int32(q))) for q in range(16)]
    assert got == [int(v) for v in KVALUES_IQ4NL]


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_cell_kernels_are_ggmls_vec_dot_and_to_float(name: str) -> None:
    """The kernels flash attention runs per run of cells: ``block_scores`` (each block's integer sum
    decoded from the row's bytes) equals llama-quant's vec_dot for every cell, KV head and query head of
    the group, scaled; ``block_values`` equals ggml's to_float (``decode_rows``). Cells out of order, a
    run that starts inside the list, random scales of every magnitude, mins of both signs."""
    t = kv_type(name)
    rng = np.random.default_rng(7)
    head_dim, n_head_kv, group, n_cells = 64, 3, 3, 41
    k = rng.standard_normal((n_cells, n_head_kv * head_dim)).astype(np.float32)
    k *= np.exp2(rng.integers(-12, 6, (n_cells, 1))).astype(np.float32)
    k += rng.standard_normal((n_cells, 1)).astype(np.float32)  # blocks with a min far from zero
    raw = encode_rows(t, k)
    nq = n_head_kv * group * head_dim
    q = rng.standard_normal((2, nq)).astype(np.float32)
    _qr, xq, xd, xs, _xsum = fa._ready(q, 2, nq, t.code)
    cells = rng.permutation(n_cells).astype(np.int32)
    jlo, length, scale = 5, n_cells - 7, np.float32(0.125)
    values = decode_rows(t, raw, n_head_kv * head_dim)
    hb = t.row_bytes(head_dim)
    for kh in range(n_head_kv):
        w = np.zeros((group, length), np.float32)
        qo = kh * group * head_dim
        kv_dots.block_scores(
            w, raw, cells, jlo, length, kh * hb, t.code, head_dim, group, xq, xd, xs, 1, qo, scale, 32
        )
        head = np.ascontiguousarray(raw[cells[jlo : jlo + length], kh * hb : (kh + 1) * hb]).reshape(-1)
        for g in range(group):
            expect = np.zeros(length, np.float32)
            h0 = qo + g * head_dim
            ref.matvec(expect, head, t.qtype, length, head_dim, q[1, h0 : h0 + head_dim])
            assert np.array_equal(w[g], expect * scale)
        got = np.empty((n_cells, head_dim), np.float32)
        _values(got, raw, kh * hb, t.code, head_dim)
        assert np.array_equal(got, values[:, kh * head_dim : (kh + 1) * head_dim])


@numba.njit(cache=False)
def _values(out, raw, vo, kind, head_dim):  # type: ignore[no-untyped-def]
    v32 = np.empty(head_dim, np.float32)
    for c in range(out.shape[0]):
        kv_dots.block_values(v32, raw, c, vo, kind, head_dim, 32)
        out[c] = v32


@pytest.mark.parametrize("name", ["f32", "f16"])
def test_typed_kernel_equals_the_default_one(name: str) -> None:
    """Without flash attention the typed kernel computes what ``attention`` computes, to the bit."""
    rng = np.random.default_rng(3)
    n, n_cells, n_head, n_head_kv, head_dim = 5, 12, 4, 2, 32
    dtype = np.float32 if name == "f32" else np.float16
    k = rng.standard_normal((n_cells, n_head_kv * head_dim)).astype(dtype)
    v = rng.standard_normal((n_cells, n_head_kv * head_dim)).astype(dtype)
    q = rng.standard_normal((n, n_head * head_dim)).astype(np.float32)
    cells = np.arange(n_cells, dtype=np.int32)
    lo = np.zeros(n, np.int32)
    hi = np.arange(n_cells - n + 1, n_cells + 1, dtype=np.int32)
    a = np.zeros_like(q)
    b = np.zeros_like(q)
    attention(a, q, k, v, cells, lo, hi, n, n_head, n_head_kv, head_dim, 0.125)
    t = kv_type(name)
    attention_typed(b, q, k, v, cells, lo, hi, n, n_head, n_head_kv, head_dim, 0.125, t.code, t.code, False)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("flash", [False, True], ids=["mha", "flash"])
@pytest.mark.parametrize("name", ["f32", "f16", "bf16", *BLOCK_TYPES])
def test_phased_jobs_equal_whole_ones(name: str, flash: bool) -> None:
    """Few (token, KV head) jobs run in phases cut by cells, heads and 32-value blocks: the same bits as one
    job per token and KV head, for every type, with permuted cells, ranges that differ per token (one of
    a single cell) and runs of cells that do not divide them."""
    names = (name, "f16") if not flash and name in BLOCK_TYPES else (name, name)  # a block V needs flash
    kinds = tuple(kv_type(x).code for x in names)
    rng = np.random.default_rng(5)
    n, n_cells, n_head, n_head_kv, head_dim = 3, 45, 6, 2, 64
    kc, vc = (
        encode_rows(kv_type(x), rng.standard_normal((n_cells, n_head_kv * head_dim)).astype(np.float32))
        for x in names
    )
    q = rng.standard_normal((n, n_head * head_dim)).astype(np.float32)
    cells = rng.permutation(n_cells).astype(np.int32)
    lo, hi = np.array([0, 3, 7], np.int32), np.array([40, 45, 8], np.int32)
    results = []
    for phased in (False, True):
        out = np.full_like(q, np.nan)
        args = (out, q, kc, vc, cells, lo, hi, n, n_head, n_head_kv, head_dim, 0.125, *kinds, flash)
        fa.attention_typed(*args, phased=phased, split=7, threads=2)
        results.append(out)
    assert not np.isnan(results[0]).any()
    assert np.array_equal(results[0], results[1])


@pytest.fixture(scope="module")
def model64(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tiny llama with 64-value heads (block types fit, the rotation applies)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiny_models, "HEAD_DIM", 64)
        yield write_tiny_model(tmp_path_factory.mktemp("kv64") / "llama64.gguf", "llama", seed=11)


def _engine(path: Path, **kw) -> Engine:
    cfg = EngineConfig(**{"n_ctx": 128, "n_parallel": 1, "n_batch": 64, "warmup": False, **kw})
    engine = Engine(path, cfg).start()
    engine.ready.wait()
    return engine


def _tokens(engine: Engine, prompt: list[int], n: int) -> list[int]:
    events = list(engine.submit(GenerationRequest(prompt=prompt, max_tokens=n, sampling=GREEDY, slot=0)))
    assert isinstance(events[-1], FinalEvent)
    return [e.token for e in events if isinstance(e, TokenEvent)]


def test_slot_files_carry_the_type(model64: Path, tmp_path: Path) -> None:
    prompt = [256, *range(40, 70)]
    q = _engine(model64, cache_type_k="q8_0", cache_type_v="q4_0", flash_attn="auto")
    try:
        assert q.kv.flash_attn and q.kv.pools[0].k[0].dtype == np.uint8
        before = _tokens(q, prompt, 6)
        q.save_slot(0, tmp_path / "q.bin")
        q.erase_slot(0)
        q.restore_slot(0, tmp_path / "q.bin")
        assert _tokens(q, prompt, 6) == before
    finally:
        q.shutdown()
    f = _engine(model64)
    try:
        with pytest.raises(
            StateFileError, match=r"holds a q8_0/q4_0 \(K/V\) KV cache, this server's cache is f16/f16"
        ):
            f.restore_slot(0, tmp_path / "q.bin")
    finally:
        f.shutdown()


def test_context_shift_of_a_block_type_cache(model64: Path) -> None:
    """Shifting a q8_0 K cache (to f32, un-rotate, RoPE, rotate, requantize) keeps the keys close to an f32
    cache shifted the same way."""
    engines = [_engine(model64, cache_type_k=t, cache_type_v="f32") for t in ("q8_0", "f32")]
    try:
        for e in engines:
            _tokens(e, [256, *range(40, 60)], 1)
        rows = []
        for e in engines:
            pool = e.kv.pools[0]
            pool.seq_rm(0, 0, 5)
            pool.seq_add(0, 5, -1, -5, e.model.shift_k)
            cells = pool.seq_cells(0)
            k = decode_rows(pool.type_k, pool.k[1][cells], pool.kv_dim)
            if pool.rot_k:
                fa.fwht_rows(k, len(k), 0, pool.kv_dim, pool.rot_k)
            rows.append(k)
        assert rows[0].shape == rows[1].shape
        assert np.abs(rows[0] - rows[1]).max() < 0.05 * np.abs(rows[1]).max()
    finally:
        for e in engines:
            e.shutdown()


@pytest.mark.parametrize("flash", [False, True], ids=["mha", "flash"])
@pytest.mark.parametrize("name", ["f32", "f16", "bf16", "q8_0"])
def test_sinks_in_phased_and_whole_jobs(name: str, flash: bool) -> None:
    """Attention sinks, below and above the scores, in phased and whole jobs: the same bits; without flash
    attention on f32 and f16 the typed kernel equals ``attention``'s with the same sinks."""
    names = (name, "f16") if not flash and name in BLOCK_TYPES else (name, name)
    kinds = tuple(kv_type(x).code for x in names)
    rng = np.random.default_rng(8)
    n_cells, n_head, n_head_kv, head_dim = 45, 6, 2, 64
    sinks = np.array([-30.0, -1.0, 0.0, 1.5, 4.0, 50.0], np.float32)
    kc, vc = (
        encode_rows(kv_type(x), rng.standard_normal((n_cells, n_head_kv * head_dim)).astype(np.float32))
        for x in names
    )
    q = rng.standard_normal((3, n_head * head_dim)).astype(np.float32)
    cells = rng.permutation(n_cells).astype(np.int32)
    lo, hi = np.array([0, 3, 7], np.int32), np.array([40, 45, 8], np.int32)
    results = []
    for phased in (False, True):
        out = np.full_like(q, np.nan)
        args = (out, q, kc, vc, cells, lo, hi, 3, n_head, n_head_kv, head_dim, 0.125, *kinds, flash)
        fa.attention_typed(*args, phased=phased, split=7, threads=2, sinks=sinks)
        results.append(out)
    assert not np.isnan(results[0]).any()
    assert np.array_equal(results[0], results[1])
    if name in ("f32", "f16") and not flash:
        plain = np.zeros_like(q)
        attention(plain, q, kc, vc, cells, lo, hi, 3, n_head, n_head_kv, head_dim, 0.125, sinks=sinks)
        assert np.array_equal(plain, results[0])
