"""Text evaluated in chunks of ``n_ctx`` tokens, ``n_batch / n_ctx`` chunks at a time as parallel sequences
(llama-perplexity's and llama-imatrix's loop), and the perplexity of the second half of each chunk."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import click
import numba
import numpy as np

from gguf_io import GGUFFile
from gguf_io import open as open_gguf

from .arch import DecoderModel, load_model
from .batch import Batch
from .kv_types import flash_attn_mode
from .tokenizer import Tokenizer

__all__ = [
    "ChunkProgress",
    "Loaded",
    "NllSum",
    "chunk_logits",
    "eta_line",
    "flash_attn_option",
    "load",
    "log_probs",
    "seq_layout",
]

N_UBATCH = 512  # llama.cpp's default physical batch


def _flash_attn(ctx: click.Context, param: click.Parameter, value: str) -> bool:
    fa = flash_attn_mode(value)
    if fa is None:
        raise click.BadParameter(f"error: unknown value for --flash-attn: '{value}'", ctx, param)
    return fa != "off"  # auto: on, as llama.cpp resolves it on a CPU (every layer supports it)


flash_attn_option = click.option(
    "-fa",
    "--flash-attn",
    "flash_attn",
    default="auto",
    show_default=True,
    envvar="LLAMA_ARG_FLASH_ATTN",
    callback=_flash_attn,
    help="flash attention: on, off or auto (auto: on)",
)


def eta_line(func: str, dt: float, n_chunk: int, n_seq: int) -> str:
    """llama.cpp's line after the first pass: its time and the whole run's estimate (hours, then minutes)."""
    total = int(dt * n_chunk / n_seq)
    hours = f"{total // 3600} hours " if total >= 3600 else ""
    return f"{func}: {dt:.2f} seconds per pass - ETA {hours}{total % 3600 / 60.0:.2f} minutes"


def seq_layout(n_ctx: int, n_batch: int) -> tuple[int, int]:
    """(sequences evaluated together, effective batch size) as llama-perplexity and llama-imatrix set their
    context: ``max(1, n_batch / n_ctx)`` sequences of ``n_ctx`` cells, the batch capped at their total."""
    n_seq = max(1, n_batch // n_ctx)
    return n_seq, min(n_batch, n_seq * n_ctx)


@dataclass(slots=True)
class Loaded:
    gguf: GGUFFile
    model: DecoderModel
    tokenizer: Tokenizer


def load(path: str | os.PathLike[str], n_threads: int = -1) -> Loaded:
    """The model and its tokenizer, with ``n_threads`` kernel threads (-1: all)."""
    if n_threads > 0:
        numba.set_num_threads(min(n_threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    gguf = open_gguf(path)
    model = load_model(gguf)
    tok = Tokenizer.from_gguf(gguf.tokenizer, gguf.header.name, gguf.header.architecture)
    return Loaded(gguf, model, tok)


def chunk_logits(
    m: Loaded,
    tokens: list[int],
    n_ctx: int,
    n_batch: int,
    n_chunk: int,
    first: int,
    flash_attn: bool = False,
    n_seq: int = 0,
) -> Iterator[tuple[int, list[np.ndarray]]]:
    """For each group of chunks evaluated together: (index of its first chunk, per chunk the logits of
    positions ``first..n_ctx-1`` [n_ctx - first, n_vocab]). The first token of each chunk is replaced by BOS
    when the model adds one. ``n_seq``: chunks per group (0: ``n_batch / n_ctx``)."""
    n_seq = n_seq or max(1, n_batch // n_ctx)
    bos = m.tokenizer.bos_id if m.tokenizer.add_bos else None
    kv = m.model.make_kv_cache(n_seq * n_ctx, n_seq_max=n_seq, n_ubatch=N_UBATCH, flash_attn=flash_attn)
    for i in range(0, n_chunk, n_seq):
        kv.clear()
        n_in = min(n_seq, n_chunk - i)
        outs: list[list[np.ndarray]] = [[] for _ in range(n_in)]
        for j in range(0, n_ctx, n_batch):
            size = min(n_ctx - j, n_batch)
            parts = []
            for seq in range(n_in):
                start = (i + seq) * n_ctx + j
                ids = np.asarray(tokens[start : start + size], np.int32)
                if j == 0 and bos is not None:
                    ids[0] = bos
                pos = np.arange(j, j + size, dtype=np.int32)
                parts.append(Batch(ids, pos, np.full(size, seq, np.int32), pos >= first))
            _decode(m.model, kv, Batch.concat(parts), outs, first, j)
        yield i, [np.concatenate(o) for o in outs]


def _decode(model: DecoderModel, kv, batch: Batch, outs: list[list[np.ndarray]], first: int, j: int) -> None:
    for u in range(0, batch.n, N_UBATCH):
        sl = slice(u, u + N_UBATCH)
        ub = Batch(batch.tokens[sl], batch.pos[sl], batch.seq[sl], batch.output[sl])
        logits, _ = model.forward(ub, kv)
        seqs = ub.seq[ub.output]
        for s in np.unique(seqs):
            outs[int(s)].append(logits[seqs == s].copy())


def log_probs(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """log softmax(logits[r])[targets[r]] per row, in double precision."""
    x = logits.astype(np.float64)
    mx = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - mx).sum(axis=1)) + mx[:, 0]
    return x[np.arange(len(x)), targets] - lse


@dataclass(slots=True)
class NllSum:
    """Running sums of -log p and its square over scored tokens."""

    nll: float = 0.0
    nll2: float = 0.0
    count: int = 0

    def add(self, lp: np.ndarray) -> None:
        self.nll += float(-lp.sum())
        self.nll2 += float((lp * lp).sum())
        self.count += len(lp)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.count) if self.count else float("nan")

    def final(self) -> str:
        """llama.cpp's closing line."""
        nll, nll2 = self.nll / self.count, self.nll2 / self.count
        var = nll2 - nll * nll
        if var <= 0:
            return "Unexpected negative standard deviation of log(prob)"
        err = math.sqrt(var / (self.count - 1))
        return f"Final estimate: PPL = {math.exp(nll):.4f} +/- {err * math.exp(nll):.5f}"


def score_chunk(logits: np.ndarray, tokens: list[int], start: int, n_ctx: int, first: int) -> np.ndarray:
    """Log-probabilities of tokens ``first+1..n_ctx-1`` of the chunk at ``start`` from the logits of
    positions ``first..n_ctx-2``."""
    n = n_ctx - 1 - first
    targets = np.asarray(tokens[start + first + 1 : start + n_ctx], np.int64)
    return log_probs(logits[:n], targets)


class ChunkProgress:
    """Progress over chunks on stderr: a bar on a terminal (after whatever stdout printed on the line, erased
    before the next output), a plain line per finished chunk group otherwise."""

    def __init__(self, label: str, n_chunk: int, n_ctx: int, tty: bool | None = None) -> None:
        self.label, self.n_chunk, self.n_ctx = label, n_chunk, n_ctx
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.t0 = time.perf_counter()
        self._drawn = 0

    def line(self, done: int) -> str:
        """The progress text after ``done`` chunks."""
        dt = time.perf_counter() - self.t0
        tok_s = done * self.n_ctx / dt if dt > 0 else 0.0
        eta = dt / done * (self.n_chunk - done) if done else 0.0
        return f"chunk {done}/{self.n_chunk}, {tok_s:.1f} tokens/s, ETA {eta:.0f} s"

    def update(self, done: int) -> None:
        """Report ``done`` of the chunks finished."""
        if not self.tty:
            sys.stderr.write(f"{self.label}: {self.line(done)}\n")
            sys.stderr.flush()
            return
        fill = done * 20 // max(self.n_chunk, 1)
        text = f"  [{'#' * fill}{'.' * (20 - fill)}] {self.line(done)}"
        self.erase()
        sys.stderr.write(text)
        sys.stderr.flush()
        self._drawn = len(text)

    def erase(self) -> None:
        """Remove the bar (before printing more, and at the end)."""
        if self._drawn:
            sys.stderr.write(f"\033[{self._drawn}D\033[K")
            sys.stderr.flush()
            self._drawn = 0
