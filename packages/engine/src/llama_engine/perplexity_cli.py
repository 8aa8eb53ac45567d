"""``llama-perplexity``: perplexity of a model over a text in chunks, llama.cpp's way and output; with
``--kl-divergence-base FILE`` it also saves the log-probabilities, with ``--kl-divergence`` it compares the
model against such a file (see ``kld``)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import click
import numpy as np

from gguf_io import GGUFError

from .chunked import (
    ChunkProgress,
    Loaded,
    NllSum,
    chunk_logits,
    eta_line,
    flash_attn_option,
    load,
    score_chunk,
    seq_layout,
)
from .kld import BaseFile, BaseWriter, KldError, KldStats

__all__ = ["main"]


def _log(msg: str) -> None:
    click.echo(msg, err=True)


@dataclass(slots=True)
class _Args:
    model: str
    prompt_file: str
    n_chunks: int
    n_ctx: int
    n_batch: int
    n_threads: int
    flash_attn: bool
    kl_divergence: bool
    logits_file: str


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-m", "--model", "model", required=True, help="model to evaluate")
@click.option(
    "-f", "--file", "prompt_file", default="", help="text to score (not needed with --kl-divergence)"
)
@click.option("--chunks", "n_chunks", type=int, default=-1, show_default=True)
@click.option("-c", "--ctx-size", "n_ctx", type=int, default=512, show_default=True)
@click.option("-b", "--batch-size", "n_batch", type=int, default=2048, show_default=True)
@click.option("-t", "--threads", "n_threads", type=int, default=-1)
@flash_attn_option
@click.option("--kl-divergence", is_flag=True, help="KL divergence to the logits of --kl-divergence-base")
@click.option("--kl-divergence-base", "--save-all-logits", "logits_file", default="", help="logits file")
def main(**kw: object) -> None:
    """Perplexity over chunks of ``-c`` tokens; the second half of each chunk is scored."""
    try:
        sys.exit(run(_Args(**kw)))  # type: ignore[arg-type]
    except (GGUFError, KldError) as e:
        _log(str(e) if isinstance(e, KldError) else f"error: {e}")
        sys.exit(1)


def run(a: _Args) -> int:
    """The tool's body; returns the exit status."""
    if a.n_ctx <= 0:
        _log("main: perplexity tool requires '--ctx-size' > 0")
        return 1
    if a.kl_divergence:
        return _kl_divergence(a)
    if not a.prompt_file:
        _log("perplexity: no text to score (-f)")
        return 1
    return _perplexity(a)


def _perplexity(a: _Args) -> int:
    n_ctx = a.n_ctx
    n_seq, n_batch = seq_layout(n_ctx, a.n_batch)
    writer = None
    if a.logits_file:
        try:
            writer = BaseWriter(a.logits_file, n_ctx)
        except OSError:
            _log(f"perplexity: failed to open {a.logits_file} for writing")
            return 1
        _log(f"perplexity: saving all logits to {a.logits_file}")
    try:
        return _score(a, n_seq, n_batch, writer)
    finally:
        if writer is not None:
            writer.close()


def _score(a: _Args, n_seq: int, n_batch: int, writer: BaseWriter | None) -> int:
    n_ctx = a.n_ctx
    with open(a.prompt_file, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    m = load(a.model, a.n_threads)
    tokens = m.tokenizer.encode(text, add_special=True)
    if len(tokens) < 2 * n_ctx:
        _log(
            f"perplexity: you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of {n_ctx}"
        )
        _log(f"perplexity: the data file you provided tokenizes to only {len(tokens)} tokens")
        return 1
    n_chunk = len(tokens) // n_ctx if a.n_chunks < 0 else min(a.n_chunks, len(tokens) // n_ctx)
    if writer is not None:
        writer.begin(m.model.config.n_vocab, n_chunk, np.asarray(tokens[: n_chunk * n_ctx], np.int32))
    _log(
        f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}, "
        f"n_seq={n_seq}"
    )
    first, nll, t0 = n_ctx // 2, NllSum(), time.perf_counter()
    progress = ChunkProgress("perplexity", n_chunk, n_ctx)
    for i, rows in chunk_logits(m, tokens, n_ctx, n_batch, n_chunk, first, a.flash_attn, n_seq):
        progress.erase()
        if i == 0:
            _log(eta_line("perplexity", time.perf_counter() - t0, n_chunk, n_seq))
        for seq, logits in enumerate(rows):
            start = (i + seq) * n_ctx
            if writer is None:
                nll.add(score_chunk(logits, tokens, start, n_ctx, first))
            else:
                targets = np.asarray(tokens[start + first + 1 : start + n_ctx], np.int64)
                nll.add(-writer.add(logits[: len(targets)], targets))
            print(f"[{i + seq + 1}]{nll.ppl:.4f},", end="", flush=True)
        progress.update(i + len(rows))
    progress.erase()
    print()
    print(nll.final())
    _log(f"perplexity: {n_chunk * n_ctx / (time.perf_counter() - t0):.2f} tokens per second")
    return 0


def _kl_divergence(a: _Args) -> int:
    if not a.logits_file:
        _log(
            "kl_divergence: you must provide a name of a file containing the log probabilities of the base model"
        )
        return 1
    m = load(a.model, a.n_threads)
    base = BaseFile.open(a.logits_file, a.n_ctx, m.model.config.n_vocab)
    try:
        return _compare(a, m, base)
    finally:
        base.close()


def _compare(a: _Args, m: Loaded, base: BaseFile) -> int:
    n_parallel, n_batch = seq_layout(a.n_ctx, a.n_batch)
    n_ctx, n_chunk = base.n_ctx, base.n_chunk
    n_seq = max(1, n_batch // n_ctx)
    if n_seq > n_parallel:
        _log(
            f"kl_divergence: calculated n_seq={n_seq} exceeds context's n_seq_max={n_parallel}, "
            f"capping at {n_parallel}"
        )
        n_seq = n_parallel
    _log(
        f"kl_divergence: computing over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}, n_seq={n_seq}"
    )
    tokens, first, stats = base.tokens.tolist(), n_ctx // 2, KldStats()
    t0, progress = time.perf_counter(), ChunkProgress("kl_divergence", n_chunk, n_ctx)
    for i, rows in chunk_logits(m, tokens, n_ctx, n_batch, n_chunk, first, a.flash_attn, n_seq):
        progress.erase()
        if i == 0:
            _log(eta_line("kl_divergence", time.perf_counter() - t0, n_chunk, n_seq))
            print("\nchunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
                  "              Δp RMS            Same top p")  # fmt: skip
        for seq, logits in enumerate(rows):
            start = (i + seq) * n_ctx
            targets = base.tokens[start + first + 1 : start + n_ctx]
            stats.add(logits, base.rows(i + seq), targets)
            print(stats.chunk_line(i + seq + 1), flush=True)
        progress.update(i + len(rows))
    progress.erase()
    print()
    for line in stats.report():
        print(line)
    _log(f"kl_divergence: {n_chunk * n_ctx / (time.perf_counter() - t0):.2f} tokens per second")
    return 0
