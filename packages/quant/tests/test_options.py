"""--keep-split, --prune-layers, --override-kv, --max-buffer-size and row validation on tiny models.

(The same options against llama.cpp itself, on SmolLM2: test_options_parity.py.)
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from test_cli import run, types_of, write_model

import gguf_io
from gguf_io import GGMLQuantizationType as T
from gguf_io import GGUFValueType
from llama_quant import quantize
from llama_quant.rewrite import (
    KVOverride,
    OverrideTag,
    apply_to_metadata,
    override_field,
    parse_kv_override,
    parse_prune_layers,
    remap_layers,
)
from llama_quant.validate import row_data_error

# -- parsing -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "tag", "value"),
    [
        ("a.b=int:42", OverrideTag.INT, 42),
        ("a.b=int: -7x", OverrideTag.INT, -7),  # atol: leading blanks, digits, rest ignored
        ("a.b=int:abc", OverrideTag.INT, 0),
        ("a.b=float:2.5e3xyz", OverrideTag.FLOAT, 2500.0),
        ("a.b=float:.5", OverrideTag.FLOAT, 0.5),
        ("a.b=float:0x1.8p1", OverrideTag.FLOAT, 3.0),
        ("a.b=float:nope", OverrideTag.FLOAT, 0.0),
        ("a.b=bool:true", OverrideTag.BOOL, True),
        ("a.b=bool:false", OverrideTag.BOOL, False),
        ("a.b=str:x=y:z", OverrideTag.STR, "x=y:z"),
        ("a.b=str:", OverrideTag.STR, ""),
    ],
)
def test_parse_kv_override(spec, tag, value):
    o = parse_kv_override(spec)
    assert (o.key, o.tag, o.value) == ("a.b", tag, value)


def test_parse_kv_override_inf_and_nan():
    assert math.isinf(float(parse_kv_override("k=float:-inf").value))
    assert math.isnan(float(parse_kv_override("k=float:nan").value))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("novalue", "malformed"),
        ("=int:1", "malformed"),
        ("k" * 128 + "=int:1", "malformed"),
        ("k=bool:yes", "invalid boolean"),
        ("k=str:" + "s" * 128, "cannot exceed 127"),
        ("k=uint:3", "invalid type"),
    ],
)
def test_parse_kv_override_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_kv_override(spec)


def test_override_field_types():
    assert override_field(KVOverride("k", OverrideTag.INT, -5)) == (GGUFValueType.UINT32, 5)
    assert override_field(KVOverride("k", OverrideTag.INT, (1 << 32) + 3)) == (GGUFValueType.UINT32, 3)
    vtype, v = override_field(KVOverride("k", OverrideTag.FLOAT, 0.1))
    assert vtype == GGUFValueType.FLOAT32 and v == float(np.float32(0.1))
    assert override_field(KVOverride("k", OverrideTag.FLOAT, 1e39))[1] == math.inf
    assert override_field(KVOverride("k", OverrideTag.BOOL, True)) == (GGUFValueType.BOOL, True)


def test_apply_to_metadata_only_matching_kinds():
    md = {"a": 3, "b": "x", "c": True}
    ovr = [
        KVOverride("a", OverrideTag.INT, 9),
        KVOverride("b", OverrideTag.INT, 1),  # wrong kind: the loader keeps the file's value
        KVOverride("c", OverrideTag.INT, 0),
        KVOverride("d", OverrideTag.STR, "new"),
    ]
    assert apply_to_metadata(md, ovr) == {"a": 9, "b": "x", "c": True, "d": "new"}


def test_parse_prune_layers():
    assert parse_prune_layers("5,1,5,3") == (1, 3, 5)
    assert parse_prune_layers("2x") == (2,)  # std::stoi
    for bad in ("-1", "a", "1,,2", "99999999999"):
        with pytest.raises(ValueError, match="invalid layer id"):
            parse_prune_layers(bad)


def test_remap_layers():
    names = ["token_embd.weight", *(f"blk.{i}.attn_q.weight" for i in range(5)), "output.weight"]
    mapping, count = remap_layers(names, (1, 3))
    assert mapping == {
        "token_embd.weight": "token_embd.weight",
        "blk.0.attn_q.weight": "blk.0.attn_q.weight",
        "blk.2.attn_q.weight": "blk.1.attn_q.weight",
        "blk.4.attn_q.weight": "blk.2.attn_q.weight",
        "output.weight": "output.weight",
    }
    assert count == 3
    assert remap_layers(names, ())[1] == -1
    assert remap_layers(names, (9,)) == ({n: n for n in names}, 5)


# -- row validation ------------------------------------------------------------------------------------------


def _f16(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float16).view(np.uint8)


def test_row_data_error_float_types():
    assert row_data_error(T.F16, _f16(*range(100))) is None
    x = np.zeros(100, dtype=np.float16)
    x[70] = np.inf
    assert row_data_error(T.F16, x.view(np.uint8)) == "found inf value at block 70"
    x[3] = np.nan
    assert row_data_error(T.F16, x.view(np.uint8)) == "found nan value at block 3"
    y = np.ones(9, dtype=np.float32)
    y[8] = -np.inf
    assert row_data_error(T.F32, y.view(np.uint8)) == "found inf value at block 8"
    bf = (np.array([1.0, np.nan, np.nan, np.inf], dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    assert row_data_error(T.BF16, bf.view(np.uint8)) == "found 2 NaNs in row of 4 BF16 values"
    assert row_data_error(T.F16, np.zeros(3, dtype=np.uint8)).startswith("invalid size 3")


@pytest.mark.parametrize(("qtype", "offset"), [(T.Q4_0, 0), (T.Q4_1, 2), (T.Q6_K, 208), (T.Q2_K, 82)])
def test_row_data_error_block_scales(qtype, offset):
    rng = np.random.default_rng(0)
    ncols = 512
    raw = quantize(rng.standard_normal((2, ncols)).astype(np.float32), qtype).copy()
    assert row_data_error(qtype, raw) is None
    size = raw.size // (2 * ncols // (256 if qtype in (T.Q6_K, T.Q2_K) else 32))
    block = 3 if size * 3 < raw.size else 1
    raw[block * size + offset : block * size + offset + 2] = _f16(np.nan)
    assert row_data_error(qtype, raw) == f"found nan value at block {block}"


def test_row_data_error_other_layouts():
    q8k = np.zeros(292 * 2, dtype=np.uint8)
    q8k[292:296] = np.array([np.inf], dtype=np.float32).view(np.uint8)
    assert row_data_error(T.Q8_K, q8k) == "found inf value at block 1"
    mx = np.zeros(17 * 3, dtype=np.uint8)
    mx[34] = 0xFF
    assert row_data_error(T.MXFP4, mx) == "found invalid e value 255 at block 2"
    assert row_data_error(T.I32, np.full(8, 0xFF, dtype=np.uint8)) is None
    assert row_data_error(T.Q8_1, np.zeros(40, dtype=np.uint8)) == "invalid type Q8_1"


# -- the command line ----------------------------------------------------------------------------------------


@pytest.fixture
def model(tmp_path) -> Path:
    return write_model(tmp_path / "tiny-f32.gguf", n_layer=4)


def test_prune_layers_renumbers_and_sets_block_count(model, tmp_path, capsys):
    out = tmp_path / "pruned.gguf"
    status, _, err = run(capsys, "--prune-layers", "2,0", model, out, "Q8_0")
    assert status == 0, err
    with gguf_io.open(out) as f, gguf_io.open(model) as src:
        assert f.metadata["llama.block_count"] == 2
        assert list(f.fields)[-1] == "llama.block_count"
        blocks = sorted({n.split(".")[1] for n in f.tensors if n.startswith("blk.")})
        assert blocks == ["0", "1"]
        # new blk.0 is old blk.1, new blk.1 is old blk.3
        for new, old in ((0, 1), (1, 3)):
            a = f.tensor_bytes(f"blk.{new}.attn_norm.weight")
            assert np.array_equal(a, src.tensor_bytes(f"blk.{old}.attn_norm.weight"))
        assert len(f.tensors) == 3 + 2 * 9


def test_override_kv_written_last_in_order(model, tmp_path, capsys):
    out = tmp_path / "o.gguf"
    args = ["--override-kv", "general.name=str:renamed", "--override-kv", "x.n=int:-3"]
    status, _, err = run(capsys, *args, "--override-kv", "x.f=float:0.25", model, out, "Q8_0")
    assert status == 0, err
    with gguf_io.open(out) as f:
        assert list(f.fields)[-3:] == ["general.name", "x.n", "x.f"]
        assert f.metadata["general.name"] == "renamed" and f.metadata["x.n"] == 3
        assert f.fields["x.n"].value_type == GGUFValueType.UINT32
        assert f.fields["x.f"].value_type == GGUFValueType.FLOAT32 and f.metadata["x.f"] == 0.25


def test_bad_options_are_one_line_errors(model, tmp_path, capsys):
    for args in (
        ["--override-kv", "k=bool:maybe"],
        ["--prune-layers", "1,-2"],
        ["--max-buffer-size", "0"],
    ):
        status, _, err = run(capsys, *args, model, tmp_path / "x.gguf", "Q8_0")
        assert status == 1 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "x.gguf").exists()


def test_keep_split_writes_the_same_shards(model, tmp_path, capsys):
    with gguf_io.open(model) as f:
        w = gguf_io.GGUFWriter(tmp_path / "split.gguf", split_max_tensors=15)
        for fld in f.fields.values():
            w.add_field(fld)
        for name, t in f.tensors.items():
            w.add_tensor(name, t.shape, t.ggml_type, f.tensor_bytes(name).copy())
        first = Path(w.finish()[0])
    status, _, err = run(capsys, "--keep-split", first, tmp_path / "q.gguf", "Q8_0")
    assert status == 0, err
    shards = sorted(tmp_path.glob("q-*.gguf"))
    assert [p.name for p in shards] == [
        "q-00001-of-00003.gguf",
        "q-00002-of-00003.gguf",
        "q-00003-of-00003.gguf",
    ]
    with gguf_io.open(shards[0]) as q, gguf_io.open(first) as s:
        assert {n: t.shard for n, t in q.tensors.items()} == {n: t.shard for n, t in s.tensors.items()}
        assert list(q.tensors) == sorted(s.tensors, key=lambda n: (s.tensors[n].shard, s.tensors[n].offset))
        assert q.metadata["split.count"] == 3 and q.metadata["general.file_type"] == 7
    # the default name is a prefix too, and an unsplit input gives one -00001-of-00001 shard
    status, _, err = run(capsys, "--keep-split", model, "Q8_0")
    assert status == 0, err
    one = tmp_path / "ggml-model-Q8_0-00001-of-00001.gguf"
    with gguf_io.open(one) as f:
        assert "split.count" not in f.metadata and len(f.tensors) == 3 + 4 * 9


def test_max_buffer_size_does_not_change_bytes(model, tmp_path, capsys):
    assert run(capsys, model, tmp_path / "a.gguf", "Q4_K_M")[0] == 0
    assert run(capsys, "--max-buffer-size", "1", model, tmp_path / "b.gguf", "Q4_K_M")[0] == 0
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def _with_bad_value(src: Path, dst: Path, name: str, to_f16: bool) -> Path:
    with gguf_io.open(src) as f:
        w = gguf_io.GGUFWriter(dst)
        for fld in f.fields.values():
            w.add_field(fld)
        for n, t in f.tensors.items():
            x = f.tensor_bytes(n).view(np.float32).copy()
            if n == name:
                x[x.size // 2] = np.nan
            if to_f16 and len(t.shape) > 1:
                w.add_tensor(n, t.shape, T.F16, x.astype(np.float16))
            else:
                w.add_tensor(n, t.shape, t.ggml_type, x)
        w.finish()
    return dst


@pytest.mark.parametrize(
    ("name", "to_f16"),
    [("blk.1.ffn_up.weight", True), ("blk.2.attn_k.weight", False), ("blk.0.ffn_norm.weight", False)],
)
def test_invalid_input_data_is_refused(model, tmp_path, capsys, name, to_f16):
    bad = _with_bad_value(model, tmp_path / "bad.gguf", name, to_f16)
    status, _, err = run(capsys, bad, tmp_path / "out.gguf", "Q4_K_M")
    assert status == 1
    assert f"tensor '{name}' has invalid data (found nan value at block" in err
    assert not (tmp_path / "out.gguf").exists()
    # a dry run reads no tensor data, as llama.cpp's
    assert run(capsys, "--dry-run", bad, "Q4_K_M")[0] == 0


def test_scales_overflowing_fp16_fail_validation(tmp_path, capsys):
    path = write_model(tmp_path / "big.gguf", n_layer=1)
    with gguf_io.open(path) as f:
        w = gguf_io.GGUFWriter(tmp_path / "huge.gguf")
        for fld in f.fields.values():
            w.add_field(fld)
        for n, t in f.tensors.items():
            x = f.tensor_bytes(n).view(np.float32).copy()
            if n == "blk.0.attn_q.weight":
                x[:32] = 1e30  # Q8_0's d = amax / 127 is inf in fp16
            w.add_tensor(n, t.shape, t.ggml_type, x)
        w.finish()
    status, _, err = run(capsys, "--pure", tmp_path / "huge.gguf", tmp_path / "o.gguf", "Q8_0")
    assert status == 1
    assert (
        "tensor 'blk.0.attn_q.weight': quantized data validation failed (found inf value at block 0)" in err
    )
    assert types_of(path)["blk.0.attn_q.weight"] == "F32"


def test_f16_decode_is_exact_and_finds_the_first_bad_value():
    from llama_quant.formats.common import F16_TO_F32
    from llama_quant.validate import _CHUNK, f16_to_f32_checked

    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    finite = (h & 0x7C00) != 0x7C00
    h = np.ascontiguousarray(np.tile(h[finite], 3))
    out = np.empty(h.size, dtype=np.float32)
    bad = np.empty(-(-h.size // _CHUNK), dtype=np.int64)
    assert f16_to_f32_checked(h, out, bad) == -1
    assert np.array_equal(out.view(np.uint32), F16_TO_F32[h].view(np.uint32))
    h[100_000] = 0xFC00  # -inf
    h[150_000] = 0x7E01  # nan
    assert f16_to_f32_checked(h, out, bad) == 100_000
