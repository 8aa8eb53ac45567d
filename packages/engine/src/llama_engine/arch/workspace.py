"""The buffers of a forward pass, allocated once per model and batch size (llama2.c's RunState).

Every kernel of the forward pass writes into these: the numba kernels take the whole buffers and a token
count (a decode step uses the first rows), the matrix products take the first-rows views kept per token
count in a `Rows`, so a steady decode loop makes no new array. The matrices' inputs are `Activations`
(their f32 rows plus the quantized forms the products read, each converted once per input).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from llama_quant.kernels import Activations

if TYPE_CHECKING:
    from ..layers import Mamba2Buffers, MoEBuffers, ShortConvBuffers
    from ..layers.delta_net import DeltaNetBuffers

__all__ = ["EMPTY", "Rows", "Workspace"]

EMPTY = np.zeros(0, np.float32)  # an absent bias or norm weight: the kernels skip an empty vector

# The logits buffer grows to the most output rows a step has asked for, up to this size; a step asking for
# more (embedding a long input with every row's logits) gets a fresh array, so a 262k-token vocabulary does
# not hold hundreds of MiB after one such step.
LOGITS_BYTES_MAX = 64 * 2**20


class Rows:
    """The first ``n`` rows of a workspace's product outputs, as the matrices' ``out`` arguments take them."""

    __slots__ = ("gate", "gu", "k", "o", "q", "qkv", "up", "v")

    def __init__(self, ws: Workspace, n: int) -> None:
        self.qkv = ws.qkv[:n]  # [n, q | k | v]: the fused (or stacked) q/k/v product
        self.q, self.k, self.v = (None if a is None else a[:n] for a in ws.qkv_parts)
        self.o = ws.o[:n]  # [n, n_embd]: the attention output's and the FFN's products
        self.gu = ws.gu[:n]  # [n, 2 * n_ff]: the fused [gate | up] product
        self.gate, self.up = (None if a is None else a[:n] for a in ws.gate_up_parts)


class Workspace:
    """Buffers for up to ``n_batch`` tokens of one model (shapes per token below)."""

    __slots__ = (
        "_logit_rows",
        "_logits",
        "_narrow",
        "_rows",
        "attn",
        "gate_up_parts",
        "glu",
        "gu",
        "h",
        "mixer",
        "moe",
        "n_batch",
        "n_ff",
        "n_vocab",
        "o",
        "q",
        "qkv",
        "qkv_parts",
        "x",
    )

    def __init__(
        self,
        n_batch: int,
        n_embd: int,
        q_dim: int,
        kv_dim: int,
        n_ff: int,
        n_vocab: int,
        split_qkv: bool,
        split_gate_up: bool,
    ) -> None:
        f32 = np.float32
        self.n_batch, self.n_vocab, self.n_ff = n_batch, n_vocab, n_ff  # n_ff: the widest dense FFN's
        self.x = np.zeros((n_batch, n_embd), f32)  # the residual stream
        self.h = Activations(n_embd, n_batch)  # a block's normed input; at the end, the final-normed rows
        self.qkv = np.zeros(
            (n_batch, q_dim + 2 * kv_dim), f32
        )  # q | k | v (biased, normed, rotated in place)
        dims = (q_dim, kv_dim, kv_dim)
        self.qkv_parts = tuple(np.zeros((n_batch, d), f32) if split_qkv else None for d in dims)
        self.q = np.zeros((n_batch, q_dim), f32)  # q as attention reads it (scaled, f16-rounded for f16 K)
        self.attn = Activations(q_dim, n_batch)  # attention output: the output projection's input
        self.o = np.zeros((n_batch, n_embd), f32)  # a block's output before the residual add
        self.gu = np.zeros((n_batch, 0 if split_gate_up else 2 * n_ff), f32)  # [gate | up]
        self.gate_up_parts = tuple(np.zeros((n_batch, n_ff), f32) if split_gate_up else None for _ in "gu")
        self.glu = Activations(n_ff, n_batch)  # the GLU output: the down projection's input
        self.moe: MoEBuffers | None = None  # the mixture-of-experts layers' scratch, where the model has them
        # the recurrent layers' scratch, where the model has them
        self.mixer: ShortConvBuffers | Mamba2Buffers | DeltaNetBuffers | None = None
        self._logits = np.zeros((0, n_vocab), f32)
        self._logit_rows: dict[int, np.ndarray] = {}
        self._rows: dict[int, Rows] = {}
        self._narrow: dict[int, Workspace] = {}

    def for_ffn(self, n_ff: int) -> Workspace:
        """This workspace for a dense FFN ``n_ff`` wide (at most ``self.n_ff``; a model whose layers have
        different widths): itself at the widest width, else a copy sharing every buffer but the FFN's, whose
        [gate | up] rows (contiguous, ``n_ff``-wide) lie in the widest ones' memory and whose GLU output is
        its own. Made once per width."""
        if n_ff == self.n_ff:
            return self
        ws = self._narrow.get(n_ff)
        if ws is None:
            if not 0 < n_ff < self.n_ff:
                raise ValueError(f"an FFN {n_ff} wide for a workspace of {self.n_ff}")
            ws = Workspace.__new__(Workspace)
            for name in Workspace.__slots__:
                setattr(ws, name, getattr(self, name))
            m = self.n_batch
            ws.n_ff, ws._rows, ws._narrow = n_ff, {}, {}
            ws.gu = _narrowed(self.gu, m, 2 * n_ff if self.gu.shape[1] else 0)
            ws.gate_up_parts = tuple(None if a is None else _narrowed(a, m, n_ff) for a in self.gate_up_parts)
            ws.glu = Activations(n_ff, m)
            self._narrow[n_ff] = ws
        return ws

    def rows(self, n: int) -> Rows:
        """The product outputs' first ``n`` rows (made once per token count)."""
        r = self._rows.get(n)
        if r is None:
            if not 0 < n <= self.n_batch:
                raise ValueError(f"{n} tokens for a workspace of {self.n_batch}")
            r = self._rows[n] = Rows(self, n)
        return r

    def logits(self, m: int) -> np.ndarray:
        """[m, n_vocab] float32 for the output rows' logits: the workspace's own rows while they fit
        ``LOGITS_BYTES_MAX``, else a fresh array."""
        view = self._logit_rows.get(m)
        if view is not None:
            return view
        if m > len(self._logits):
            if m * self.n_vocab * 4 > LOGITS_BYTES_MAX:
                return np.empty((m, self.n_vocab), np.float32)
            self._logits = np.zeros((m, self.n_vocab), np.float32)
            self._logit_rows.clear()
        view = self._logit_rows[m] = self._logits[:m]
        return view


def _narrowed(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """A contiguous [rows, cols] view of the start of the contiguous buffer ``a`` (cols <= its width)."""
    return a.reshape(-1)[: rows * cols].reshape(rows, cols)
