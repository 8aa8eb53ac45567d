"""``llama-imatrix``: collect an importance matrix from calibration text (llama.cpp's tool and formats)."""

from __future__ import annotations

import math
import sys
import time

import click

from gguf_io import GGUFError
from llama_quant.imatrix_file import ImatrixData, all_stats, load_raw, rows_to_chunks, save_dat, save_gguf

from .chunked import (
    ChunkProgress,
    NllSum,
    chunk_logits,
    eta_line,
    flash_attn_option,
    load,
    score_chunk,
    seq_layout,
)
from .imatrix import ImatrixCollector, collecting

__all__ = ["main"]


def _log(msg: str) -> None:
    click.echo(msg, err=True)


class _Saver:
    """Writes the running result every ``ofreq`` chunks and snapshots ``<out>.at_<n>`` every ``sfreq``."""

    def __init__(self, out: str, fmt: str, dataset: str, ofreq: int, sfreq: int) -> None:
        self.out, self.fmt, self.dataset, self.ofreq, self.sfreq = out, fmt, dataset, ofreq, sfreq
        if fmt == "gguf" and not out.endswith(".gguf"):
            _log("save_imatrix: saving imatrix using GGUF format with a different suffix than .gguf")

    def save(self, data: ImatrixData, snapshot: int = 0) -> None:
        path = f"{self.out}.at_{snapshot}" if snapshot > 0 else self.out
        if self.fmt == "dat":
            save_dat(path, data, self.dataset)
        else:
            save_gguf(path, data)

    def progress(self, data: ImatrixData, before: int) -> None:
        now = data.chunk_count
        if now <= before:
            return
        if self.ofreq > 0 and now // self.ofreq > before // self.ofreq:
            self.save(data)
        if self.sfreq > 0 and now // self.sfreq > before // self.sfreq:
            self.save(data, now)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-m", "--model", "model", default="", help="model to evaluate")
@click.option("-f", "--file", "prompt_file", default="", help="calibration text")
@click.option("-o", "--output", "--output-file", "out", default="imatrix.gguf", show_default=True)
@click.option("--output-format", type=click.Choice(["gguf", "dat"]), default="gguf", show_default=True)
@click.option("-ofreq", "--output-frequency", "ofreq", type=int, default=10, show_default=True)
@click.option("--save-frequency", "sfreq", type=int, default=0, show_default=True)
@click.option("--process-output", is_flag=True, help="also collect output.weight")
@click.option("--in-file", "in_files", multiple=True, help="imatrix file to merge (repeatable)")
@click.option("--parse-special", is_flag=True)
@click.option("--chunk", "--from-chunk", "i_chunk", type=int, default=0)
@click.option("--chunks", "n_chunks", type=int, default=-1)
@click.option("--ppl/--no-ppl", default=True, show_default=True)
@click.option("--show-statistics", is_flag=True)
@click.option("-c", "--ctx-size", "n_ctx", type=int, default=512, show_default=True)
@click.option("-b", "--batch-size", "n_batch", type=int, default=2048, show_default=True)
@click.option("-t", "--threads", "n_threads", type=int, default=-1)
@flash_attn_option
def main(**kw: object) -> None:
    """Compute an importance matrix for a model and calibration text."""
    try:
        sys.exit(_run(**kw))  # type: ignore[arg-type]
    except GGUFError as e:
        _log(f"error: {e}")
        sys.exit(1)


def _run(
    model: str, prompt_file: str, out: str, output_format: str, ofreq: int, sfreq: int, process_output: bool,
    in_files: tuple[str, ...], parse_special: bool, i_chunk: int, n_chunks: int, ppl: bool,
    show_statistics: bool, n_ctx: int, n_batch: int, n_threads: int, flash_attn: bool,
) -> int:  # fmt: skip
    if n_ctx <= 0:
        _log("main: imatrix tool requires '--ctx-size' > 0")
        return 1
    n_seq, n_batch = seq_layout(n_ctx, n_batch)
    chunk_size = n_ctx
    data = ImatrixData(chunk_size=0)
    for f in in_files:
        data.merge(load_raw(f, chunk_size), chunk_size)
    if not data.chunk_size:
        data.chunk_size = chunk_size
    if show_statistics:
        if not in_files:
            _log("main: --show-statistics needs --in-file")
            return 1
        _print_stats(data)
        return 0
    saver = _Saver(out, output_format, prompt_file, ofreq, sfreq)
    if prompt_file:
        data.datasets.append(prompt_file)
    if not prompt_file:
        if not in_files:
            _log("main: no calibration text (-f) and no --in-file to combine")
            return 1
        saver.save(data)
        return 0
    if not model:
        _log("main: a model is required (-m)")
        return 1
    with open(prompt_file, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    if text.endswith("\n"):
        text = text[:-1]
    m = load(model, n_threads)
    tokens = m.tokenizer.encode(text, add_special=True, parse_special=parse_special)
    if i_chunk > 0:
        if (i_chunk + 2) * n_ctx >= len(tokens):
            _log(f"compute_imatrix: there will be not enough tokens left after removing {i_chunk} chunks")
            return 1
        tokens = tokens[i_chunk * n_ctx :]
    if len(tokens) < 2 * n_ctx:
        _log(f"compute_imatrix: you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens")
        _log(f"compute_imatrix: the data file you provided tokenizes to only {len(tokens)} tokens")
        return 1
    n_chunk = len(tokens) // n_ctx if n_chunks < 0 else min(n_chunks, len(tokens) // n_ctx)
    _log(
        f"compute_imatrix: computing over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={n_batch}, n_seq={n_seq}"
    )
    collector = ImatrixCollector(m.model, data, process_output)
    nll, first, t0 = NllSum(), n_ctx // 2, time.perf_counter()
    progress = ChunkProgress("compute_imatrix", n_chunk, n_ctx)
    with collecting(m.model, collector):
        for i, chunk_rows in chunk_logits(m, tokens, n_ctx, n_batch, n_chunk, 0, flash_attn, n_seq):
            progress.erase()
            before = data.chunk_count
            data.chunk_count = max(before, rows_to_chunks(collector.max_rows(), chunk_size))
            if i == 0:
                _log(eta_line("compute_imatrix", time.perf_counter() - t0, n_chunk, n_seq))
            if ppl:
                for seq, logits in enumerate(chunk_rows):
                    nll.add(score_chunk(logits[first:], tokens, (i + seq) * n_ctx, n_ctx, first))
                    print(f"[{i + seq + 1}]{nll.ppl:.4f},", end="", flush=True)
            saver.progress(data, before)
            progress.update(i + len(chunk_rows))
    progress.erase()
    print()
    if ppl:
        print(nll.final())
    tok_s = n_chunk * n_ctx / (time.perf_counter() - t0)
    _log(f"compute_imatrix: {tok_s:.2f} tokens per second")
    saver.save(data)
    _log(f"main: stored collected data after {data.chunk_count} chunks in {out}")
    return 0


def _print_stats(data: ImatrixData) -> None:
    stats = all_stats(data)
    print(f"{'tensor':<40} {'sum_sq':>12} {'mean':>10} {'std':>10} {'h_norm':>8} {'cossim':>8}")
    for name in sorted(stats):
        s = stats[name]
        vals = [float(s[0]), float(s[1]), float(s[3]), float(s[7]), float(s[9])]
        cells = ["nan" if math.isnan(v) else f"{v:.4g}" for v in vals]
        print(f"{name:<40} {cells[0]:>12} {cells[1]:>10} {cells[2]:>10} {cells[3]:>8} {cells[4]:>8}")
