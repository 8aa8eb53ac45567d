"""``llama-perplexity``: perplexity of a model over a text in chunks, llama.cpp's way and output."""

from __future__ import annotations

import sys
import time

import click

from .chunked import NllSum, chunk_logits, load, score_chunk

__all__ = ["main"]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-m", "--model", "model", required=True, help="model to evaluate")
@click.option("-f", "--file", "prompt_file", required=True, help="text to score")
@click.option("--chunks", "n_chunks", type=int, default=-1, show_default=True)
@click.option("-c", "--ctx-size", "n_ctx", type=int, default=512, show_default=True)
@click.option("-b", "--batch-size", "n_batch", type=int, default=2048, show_default=True)
@click.option("-t", "--threads", "n_threads", type=int, default=-1)
def main(model: str, prompt_file: str, n_chunks: int, n_ctx: int, n_batch: int, n_threads: int) -> None:
    """Perplexity over chunks of ``-c`` tokens; the second half of each chunk is scored."""
    sys.exit(run(model, prompt_file, n_chunks, n_ctx, n_batch, n_threads))


def run(model: str, prompt_file: str, n_chunks: int, n_ctx: int, n_batch: int, n_threads: int) -> int:
    """The tool's body; returns the exit status."""
    if n_ctx <= 0 or (n_batch >= n_ctx and n_batch % n_ctx):
        click.echo("perplexity: -b must be below -c or a multiple of it, -c above 0", err=True)
        return 1
    with open(prompt_file, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    m = load(model, n_threads)
    tokens = m.tokenizer.encode(text, add_special=True)
    if len(tokens) < 2 * n_ctx:
        click.echo(
            f"perplexity: you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of {n_ctx}\n"
            f"perplexity: the data file you provided tokenizes to only {len(tokens)} tokens",
            err=True,
        )
        return 1
    n_chunk = len(tokens) // n_ctx if n_chunks < 0 else min(n_chunks, len(tokens) // n_ctx)
    n_seq = max(1, n_batch // n_ctx)
    click.echo(
        f"perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}, "
        f"n_seq={n_seq}",
        err=True,
    )
    first, nll, t0 = n_ctx // 2, NllSum(), time.perf_counter()
    for i, rows in chunk_logits(m, tokens, n_ctx, n_batch, n_chunk, first):
        if i == 0:
            dt = time.perf_counter() - t0
            click.echo(
                f"perplexity: {dt:.2f} seconds per pass - ETA {dt * n_chunk / n_seq / 60:.2f} minutes",
                err=True,
            )
        for seq, logits in enumerate(rows):
            nll.add(score_chunk(logits, tokens, (i + seq) * n_ctx, n_ctx, first))
            print(f"[{i + seq + 1}]{nll.ppl:.4f},", end="", flush=True)
    print()
    print(nll.final())
    click.echo(f"perplexity: {n_chunk * n_ctx / (time.perf_counter() - t0):.2f} tokens per second", err=True)
    return 0
