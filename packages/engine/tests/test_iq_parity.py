"""Models in the i-quant and ternary types, quantized by llama.cpp itself, against llama.cpp (run by
`nox -s parity`): greedy text and logits equal to the bit.

A tiny llama (256-wide, two layers: every row a whole number of 256-value super-blocks) is written in F32
and quantized with ``--pure`` (every matrix, the token embeddings and the output included, in the one
type) by llama.cpp: through llama-cpp-python's ``llama_model_quantize`` where no importance matrix is
needed, by the ``llama-quantize`` binary with an importance matrix for the grid types, which llama.cpp
refuses to make without one.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import test_engine_parity
import tiny_models
from test_engine_parity import Oracle, _check_greedy

import gguf_io
from gguf_io import GGMLQuantizationType as T
from llama_engine import LLM
from llama_quant.imatrix_file import ImatrixData, ImatrixEntry, save_gguf

pytestmark = pytest.mark.parity

# type -> the llama.cpp file type whose --pure output is all that type (IQ2_S is the default of IQ2_M)
FTYPES = {
    T.IQ4_NL: "IQ4_NL",
    T.IQ4_XS: "IQ4_XS",
    T.MXFP4: "MXFP4_MOE",
    T.TQ1_0: "TQ1_0",
    T.TQ2_0: "TQ2_0",
    T.IQ1_S: "IQ1_S",
    T.IQ1_M: "IQ1_M",
    T.IQ2_XXS: "IQ2_XXS",
    T.IQ2_XS: "IQ2_XS",
    T.IQ2_S: "IQ2_M",
    T.IQ3_XXS: "IQ3_XXS",
    T.IQ3_S: "IQ3_S",
}
_NO_IMATRIX = (T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.TQ1_0, T.TQ2_0)
PROMPT = "The capital of France is"
N_GEN = 16  # tokens generated per model (test_engine_parity's 64 add time, not coverage, on a tiny model)


def _llama_quantize() -> Path:
    """llama.cpp's llama-quantize: $LLAMA_CPP_PORTABLE_BIN or $LLAMA_CPP_BIN, else the nox sessions' cache."""
    folders = [Path(os.environ[k]) for k in ("LLAMA_CPP_PORTABLE_BIN", "LLAMA_CPP_BIN") if os.environ.get(k)]
    folders += sorted((Path.home() / ".cache" / "llama-py").glob("llama-cpp-bin-*/bin"), reverse=True)
    for folder in folders:
        if (folder / "llama-quantize").is_file():
            return folder / "llama-quantize"
    raise RuntimeError("llama.cpp's llama-quantize was not found (build it with `nox -s llama-cpp`)")


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The F32 tiny llama and an importance matrix for every one of its matrices."""
    folder = tmp_path_factory.mktemp("iq")
    mp = pytest.MonkeyPatch()
    for name, value in dict(N_EMBD=256, N_HEAD=4, N_HEAD_KV=2, HEAD_DIM=64, N_FF=512, N_LAYER=2).items():
        mp.setattr(tiny_models, name, value)
    try:
        model = tiny_models.write_tiny_model(folder / "tiny-f32.gguf", "llama", seed=3, qtype=T.F32)
    finally:
        mp.undo()
    rng = np.random.default_rng(0)
    data = ImatrixData()
    with gguf_io.open(model) as f:
        for name, t in f.tensors.items():
            if len(t.shape) == 2:
                e = ImatrixEntry.empty(t.shape[0])
                e.sum2[:] = rng.random((1, t.shape[0])) * 10.0
                e.counts[:] = 10
                data.entries[name] = e
    save_gguf(str(folder / "imatrix.gguf"), data)
    return model, folder / "imatrix.gguf"


def _quantize(src: Path, imatrix: Path, qtype: T) -> Path:
    dst = src.with_name(f"tiny-{qtype.name}.gguf")
    if qtype in _NO_IMATRIX:
        import llama_cpp

        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{FTYPES[qtype]}")
        params.pure = True
        rc = llama_cpp.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(params))
        assert rc == 0
    else:
        args = [
            str(_llama_quantize()),
            "--pure",
            "--imatrix",
            str(imatrix),
            str(src),
            str(dst),
            FTYPES[qtype],
        ]
        subprocess.run(args, check=True, capture_output=True)
    return dst


@pytest.mark.parametrize("qtype", list(FTYPES), ids=lambda t: t.name)
def test_greedy_text_and_logits_equal_llama_cpp(
    tiny_f32: tuple[Path, Path], qtype: T, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _quantize(*tiny_f32, qtype)
    with gguf_io.open(path) as f:
        types = {t.ggml_type for t in f.tensors.values() if len(t.shape) == 2}
    assert types == {qtype}  # token_embd and output too
    with LLM(path, n_ctx=128, n_parallel=1, cache_type_k="f32", cache_type_v="f32") as llm:
        monkeypatch.setattr(test_engine_parity, "N_GEN", N_GEN)
        _check_greedy(llm, Oracle(path, "f32"), PROMPT)
