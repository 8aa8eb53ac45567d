"""A multi-turn chat on hybrid models (tiny lfm2 and qwen35) through `/v1/chat/completions` of a real
llama-server, beside one started with `-ctxcp 0`.

A recurrent state cannot be cut back to a prefix, so a turn reuses the slot only up to its last
checkpoint when the history it sends back differs from what the slot absorbed. Here each answer opens
with a `<think>` block that the client leaves out of the history it sends back, as chat clients do with
reasoning: the next prompt shares exactly the previous prompt with the slot. With checkpoints a turn
processes its new tokens and the 4 before the previous prompt's end; with `-ctxcp 0` the whole
conversation. The greedy text is the same on both servers, and an edit of an earlier user message
resumes from the checkpoint before it. Each checkpoint holds one copy of the sequence's recurrent state
(the log's `size`)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import Server, start_server, stop_server

from llama_engine import Engine, EngineConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine" / "tests"))
from tiny_models import write_tiny_model

QUESTIONS = ("Hi there.", "Tell me more.", "Why is that?", "And then?")
# ASCII letters (one byte token each, so an answer renders back to the tokens it was made of), opened
# by a reasoning block the client drops from the history
GRAMMAR = 'root ::= "<think>" [a-z] [a-z] [a-z] [a-z] "</think>" [a-z] [a-z] [a-z] [a-z]'
CREATED = re.compile(r"created context checkpoint \d+ of \d+ \(.*n_tokens = (\d+), size = ([\d.]+) MiB\)")
ERASED = re.compile(r"erasing old context checkpoint \(.*n_tokens = (\d+),")


@dataclass
class Pair:
    on: httpx.Client  # checkpoints on (the default, 32 per slot)
    off: httpx.Client  # -ctxcp 0
    server: Server  # the one with checkpoints: its log
    model: Path


@pytest.fixture(scope="module", params=["lfm2", "qwen35"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    arch = request.param
    tmp = tmp_path_factory.mktemp(f"turns-{arch}")
    model = write_tiny_model(tmp / f"{arch}.gguf", arch, seed=3)
    # the tiny models declare a 256-token training context: 1024 holds four turns and an edit
    args = ["-m", str(model), "-c", "1024", "-np", "1", "--temp", "0", "--chat-template", "chatml"]
    args += ["--override-kv", f"{arch}.context_length=int:1024"]
    on = start_server(tmp, *args)
    try:
        off = start_server(tmp, *args, "-ctxcp", "0")
    except BaseException:
        stop_server(on)
        raise
    try:
        with on.client() as a, off.client() as b:
            yield Pair(a, b, on, model)
    finally:
        stop_server(on)
        stop_server(off)


def chat(c: httpx.Client, messages: list[dict]) -> tuple[str, dict, int]:
    """The answer (its reasoning block dropped), the timings, and the prompt's length in tokens."""
    body = {"messages": messages, "max_tokens": 32, "temperature": 0, "grammar": GRAMMAR}
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    content = out["choices"][0]["message"]["content"]
    assert content.startswith("<think>")
    return content.split("</think>", 1)[1], out["timings"], out["usage"]["prompt_tokens"]


def _held(log: str) -> list[float]:
    """The sizes (MiB) of the checkpoints the log leaves held, one per position."""
    held: dict[int, float] = {}
    for line in log.splitlines():
        if m := CREATED.search(line):
            held[int(m[1])] = float(m[2])
        elif m := ERASED.search(line):
            held.pop(int(m[1]), None)
    return list(held.values())


def _state_bytes(model: Path) -> int:
    """One sequence's recurrent state as a checkpoint copies it: its position and every recurrent layer's
    conv and SSM rows, float32."""
    engine = Engine(model, EngineConfig(n_ctx=64, n_parallel=1, warmup=False))
    try:
        pool = next(p for p in engine.kv.pools if getattr(p, "recurrent", False))
        return 4 + 4 * len(pool.layers) * (pool.r_dim + pool.s_dim)
    finally:
        engine.shutdown()


def test_turns_resume_from_checkpoints_with_the_text_of_a_full_recompute(pair: Pair) -> None:
    messages: list[dict] = []
    prompts, figures = [], []
    for k, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question})
        (reply, t, n), (ref, t_ref, n_ref) = chat(pair.on, messages), chat(pair.off, messages)
        assert (reply, n) == (ref, n_ref)
        figures.append((n, t["prompt_n"], t_ref["prompt_n"]))
        assert t_ref["prompt_n"] == n  # -ctxcp 0: the slot's state ran past the shared prefix
        if k == 0:
            assert t["prompt_n"] == n
        else:
            # resumed 4 tokens before the previous prompt's end: the new turn's tokens and those 4
            assert t["cache_n"] == prompts[-1] - 4 and t["prompt_n"] == n - prompts[-1] + 4
            assert t["prompt_n"] < (n if k == 1 else n // 2)
        prompts.append(n)
        messages.append({"role": "assistant", "content": reply})
    print("prompt tokens, prompt_n with checkpoints, with -ctxcp 0:", figures)
    last_turn = figures[-1][1]

    # the second question edited: the shared prefix ends inside it, after the first prompt's checkpoint
    edited = [*messages[:2], {"role": "user", "content": "Tell me less."}, *messages[3:]]
    (reply, t, n), (ref, t_ref, _) = chat(pair.on, edited), chat(pair.off, edited)
    print("edited second question: prompt_n", t["prompt_n"], "of", n, "(-ctxcp 0:", t_ref["prompt_n"], ")")
    assert reply == ref and t_ref["prompt_n"] == n
    assert t["cache_n"] == prompts[0] - 4
    assert last_turn < t["prompt_n"] < n

    # what the checkpoints hold: each one copy of the sequence's recurrent state
    sizes = _held(pair.server.log.read_text())
    assert len(sizes) >= len(QUESTIONS)  # at least one per turn
    want = _state_bytes(pair.model) / 1024 / 1024
    assert all(f"{s:.3f}" == f"{want:.3f}" for s in sizes), (sizes, want)
    print(f"{len(sizes)} checkpoints of {want * 1024:.2f} KiB: {len(sizes) * want * 1024:.2f} KiB")
