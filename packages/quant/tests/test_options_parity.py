"""--keep-split, --prune-layers and --override-kv against llama.cpp's llama_model_quantize on SmolLM2.

llama_model_quantize_params carries keep_split, prune_layers and kv_overrides, so each option is driven on
both sides with the same values and the output files must be byte-identical.
"""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

import pytest
from test_cli_parity import _llama_cpp, _smollm2_path, file_types, llama_cpp_quantize, write_f16

import gguf_io
from gguf_io import GGUFValueType
from llama_quant.cli import main
from llama_quant.mixture import parse_file_type
from llama_quant.rewrite import parse_kv_override

pytestmark = pytest.mark.parity


@pytest.fixture(scope="module")
def smollm2_f16(tmp_path_factory) -> Path:
    return write_f16(_smollm2_path(), tmp_path_factory.mktemp("opts") / "smollm2-f16.gguf")


def _same(a: Path, b: Path, types: bool = True) -> None:
    if types:
        assert file_types(a) == file_types(b)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest(), f"{a} != {b}"


def _split_copy(src: Path, prefix: Path, per_shard: int) -> Path:
    """The same model as shards of ``per_shard`` tensors (gguf_io's writer, llama.cpp's split keys)."""
    with gguf_io.open(src) as f:
        w = gguf_io.GGUFWriter(f"{prefix}.gguf", split_max_tensors=per_shard)
        for fld in f.fields.values():
            w.add_field(fld)
        for name, t in f.tensors.items():
            w.add_tensor(name, t.shape, t.ggml_type, lambda name=name: f.tensor_bytes(name))
        paths = w.finish()
    return Path(paths[0])


@pytest.mark.parametrize("name", ["Q4_K_M", "Q8_0"])
def test_keep_split_matches_llama_cpp(smollm2_f16, tmp_path, name):
    first = _split_copy(smollm2_f16, tmp_path / "in", 100)
    ft = parse_file_type(name)
    llama_cpp_quantize(first, tmp_path / "theirs", ft.ftype, keep_split=True)
    assert main(["--keep-split", str(first), str(tmp_path / "ours.gguf"), name, "2"]) == 0
    theirs = sorted(tmp_path.glob("theirs-*-of-*.gguf"))
    ours = sorted(tmp_path.glob("ours-*-of-*.gguf"))
    assert [p.name for p in ours] == [f"ours-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert len(theirs) == 3
    assert file_types(theirs[0]) == file_types(ours[0])
    for a, b in zip(theirs, ours, strict=True):
        _same(a, b, types=False)
    with gguf_io.open(ours[0]) as f:
        assert len(f.tensors) == 272 and f.metadata["split.count"] == 3


def test_keep_split_of_an_unsplit_model(smollm2_f16, tmp_path):
    ft = parse_file_type("Q4_K_M")
    llama_cpp_quantize(smollm2_f16, tmp_path / "theirs", ft.ftype, keep_split=True)
    assert main(["--keep-split", str(smollm2_f16), str(tmp_path / "ours"), "Q4_K_M", "2"]) == 0
    _same(tmp_path / "theirs-00001-of-00001.gguf", tmp_path / "ours-00001-of-00001.gguf")


@pytest.mark.parametrize("layers", [[0, 7, 29], [12], [31, 3, 3]])
def test_prune_layers_matches_llama_cpp(smollm2_f16, tmp_path, layers):
    ft = parse_file_type("Q4_K_M")
    ids = sorted(set(layers))
    arr = (ctypes.c_int32 * (len(ids) + 1))(*ids, -1)
    llama_cpp_quantize(smollm2_f16, tmp_path / "theirs.gguf", ft.ftype, prune_layers=arr)
    spec = ",".join(str(i) for i in layers)
    assert main(["--prune-layers", spec, str(smollm2_f16), str(tmp_path / "ours.gguf"), "Q4_K_M", "2"]) == 0
    _same(tmp_path / "theirs.gguf", tmp_path / "ours.gguf")
    kept = 30 - len([i for i in ids if i < 30])
    with gguf_io.open(tmp_path / "ours.gguf") as f:
        assert f.metadata["llama.block_count"] == kept
        assert f.fields["llama.block_count"].value_type == GGUFValueType.UINT32
        assert (
            f"blk.{kept - 1}.ffn_down.weight" in f.tensors and f"blk.{kept}.ffn_down.weight" not in f.tensors
        )


OVERRIDES = [
    "general.name=str:pruned and renamed",
    "llama.context_length=int:-4096",
    "llama.rope.freq_base=float:12345.678",
    "tokenizer.ggml.add_bos_token=bool:false",
    "custom.new_flag=bool:true",
    "custom.count=int:70000000000",
    "custom.scale=float:1e39",
    "custom.text=str:",
]


def _kv_array(lc, specs: list[str]):
    arr = (lc.llama_model_kv_override * (len(specs) + 1))()
    for i, spec in enumerate(specs):
        o = parse_kv_override(spec)
        arr[i].key = o.key.encode()
        arr[i].tag = int(o.tag)
        if o.tag == 0:
            arr[i].value.val_i64 = int(o.value)
        elif o.tag == 1:
            arr[i].value.val_f64 = float(o.value)
        elif o.tag == 2:
            arr[i].value.val_bool = bool(o.value)
        else:
            arr[i].value.val_str = str(o.value).encode()
    arr[len(specs)].key = b""
    return arr


def test_override_kv_matches_llama_cpp(smollm2_f16, tmp_path):
    lc = _llama_cpp()
    arr = _kv_array(lc, OVERRIDES)
    ptr = ctypes.cast(arr, ctypes.POINTER(lc.llama_model_kv_override))
    ft = parse_file_type("Q8_0")
    llama_cpp_quantize(smollm2_f16, tmp_path / "theirs.gguf", ft.ftype, kv_overrides=ptr)
    args = [a for o in OVERRIDES for a in ("--override-kv", o)]
    assert main([*args, str(smollm2_f16), str(tmp_path / "ours.gguf"), "Q8_0", "2"]) == 0
    _same(tmp_path / "theirs.gguf", tmp_path / "ours.gguf")
    with gguf_io.open(tmp_path / "ours.gguf") as f:
        md = f.metadata
        assert md["general.name"] == "pruned and renamed"
        assert md["llama.context_length"] == 4096
        assert md["tokenizer.ggml.add_bos_token"] is False
        assert md["custom.count"] == 70000000000 % (1 << 32)
        assert list(md)[-1] == "custom.text"


def test_prune_with_imatrix_and_keep_split_matches_llama_cpp(smollm2_f16, tmp_path):
    """Pruned layers take the importance entries of their original block; with keep_split in file order."""
    from test_cli_parity import _imatrix_args, write_imatrix

    lc = _llama_cpp()
    imat = write_imatrix(smollm2_f16, tmp_path / "imatrix.gguf")
    arr, kvs, keep = _imatrix_args(lc, imat)
    prune = (ctypes.c_int32 * 3)(4, 20, -1)
    ft = parse_file_type("Q4_K_M")
    llama_cpp_quantize(
        smollm2_f16,
        tmp_path / "theirs",
        ft.ftype,
        keep_split=True,
        prune_layers=prune,
        imatrix=ctypes.cast(arr, ctypes.POINTER(lc.llama_model_imatrix_data)),
        kv_overrides=ctypes.cast(kvs, ctypes.POINTER(lc.llama_model_kv_override)),
    )
    del keep
    args = ["--keep-split", "--prune-layers", "20,4", "--imatrix", str(imat)]
    assert main([*args, str(smollm2_f16), str(tmp_path / "ours"), "Q4_K_M", "2"]) == 0
    _same(tmp_path / "theirs-00001-of-00001.gguf", tmp_path / "ours-00001-of-00001.gguf")
