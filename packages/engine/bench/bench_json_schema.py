"""JSON-schema grammars: the time to build the grammar for typical schemas (convert + parse, ms), and
SmolLM2's decode speed under one of them against the same requests unconstrained (bench_grammar.py's
method: alternating rounds, best round, engine decode timings; the target is within 15%).
"""

from __future__ import annotations

import argparse
import time

from bench_grammar import PROMPT, ROUNDS, THREADS, decode_rate, smollm2_path

TYPICAL = {
    "type": "object",
    "properties": {
        "cats": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "age": {"type": "integer", "minimum": 0, "maximum": 30},
                    "colour": {"enum": ["black", "white", "ginger", "grey", "tabby"]},
                    "food": {"type": "string"},
                    "born": {"type": "string", "format": "date"},
                },
                "required": ["name", "age", "colour"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["cats"],
    "additionalProperties": False,
}
TOOL = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "when": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": False},
    },
    "required": ["city"],
}


def build_ms(schema: dict, repeat: int = 50) -> float:
    from llama_engine.grammar import parse_grammar
    from llama_engine.grammar.schema import json_schema_to_grammar

    t = time.perf_counter()
    for _ in range(repeat):
        parse_grammar(json_schema_to_grammar(schema))
    return (time.perf_counter() - t) * 1e3 / repeat


def main() -> None:
    from llama_engine import LLM
    from llama_engine.grammar.schema import json_schema_to_grammar

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--decode", type=int, default=128)
    args = parser.parse_args()
    print("\n## building a grammar from a JSON schema (convert + parse), ms\n")
    print("| schema | ms |\n|---|---|")
    for name, schema in (("cats (nested object, array, enum, date)", TYPICAL), ("tool parameters", TOOL)):
        print(f"| {name} | {build_ms(schema):.2f} |")
    grammar = json_schema_to_grammar(TYPICAL)
    best = {"unconstrained": 0.0, "json schema": 0.0}
    n_tokens = dict.fromkeys(best, 0)
    with LLM(smollm2_path(), n_ctx=1024, n_threads=THREADS, n_parallel=1) as llm:
        list(llm.generate(PROMPT, max_tokens=4, temperature=1.0, seed=1, grammar=grammar))  # builds the trie
        list(llm.generate(PROMPT, max_tokens=8, temperature=1.0, seed=1))
        for _ in range(ROUNDS):
            for name, g in (("unconstrained", ""), ("json schema", grammar)):
                rate, n = decode_rate(llm, g, args.decode)
                if rate > best[name]:
                    best[name], n_tokens[name] = rate, n
    base = best["unconstrained"]
    print(f"\n## decode under a JSON-schema grammar, SmolLM2-135M Q4_1, {THREADS} threads, temperature 1\n")
    print("| grammar | tokens | tok/s | ratio |\n|---|---|---|---|")
    for name, rate in best.items():
        print(f"| {name} | {n_tokens[name]} | {rate:.1f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
