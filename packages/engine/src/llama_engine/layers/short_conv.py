"""The short-convolution layer kind: lfm2's ``shortconv`` block (llama.cpp's build_shortconv_block, with
its conv state through build_rs and ggml_ssm_conv).

From the normed input h [n, n_embd]: ``in_proj`` gives three chunks b, c, x; the gated input b * x runs
through a causal depthwise convolution of ``l_cache`` taps per channel whose first ``d_conv = l_cache - 1``
inputs are the sequence's conv state (the inputs of its previous tokens); c gates the result and
``out_proj`` maps it back. The state, [n_embd, d_conv] per sequence (channel-major, as llama.cpp's
``{d_conv, n_embd}`` rows), lives in the model memory's ``RecurrentPool``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numba
import numpy as np

from llama_quant.kernels import Activations, ExactMatrix

if TYPE_CHECKING:
    from ..arch.base import DecoderModel
    from ..arch.workspace import Workspace
    from ..batch import Batch
    from ..kv_cache import KVCache, Placement

__all__ = ["ShortConv", "ShortConvBuffers", "short_conv"]


class ShortConvBuffers:
    """The short-convolution layers' scratch for up to ``n_batch`` tokens (shared by the layers)."""

    __slots__ = ("bcx", "n_batch", "y")

    def __init__(self, n_batch: int, n_embd: int) -> None:
        self.n_batch = n_batch
        self.bcx = np.zeros((n_batch, 3 * n_embd), np.float32)  # [b | c | x]: in_proj's product
        self.y = Activations(n_embd, n_batch)  # c * conv(b * x): out_proj's input


@dataclass(slots=True)
class ShortConv:
    """One layer's ``shortconv.{in_proj, conv, out_proj}``."""

    in_proj: ExactMatrix  # [3 * n_embd, n_embd]
    conv: np.ndarray  # float32 [n_embd, l_cache]: each channel's taps, oldest input first
    out_proj: ExactMatrix  # [n_embd, n_embd]

    @classmethod
    def load(cls, model: DecoderModel, il: int) -> ShortConv:
        p = f"blk.{il}.shortconv."
        in_proj, out_proj = model.matrix(p + "in_proj.weight"), model.matrix(p + "out_proj.weight")
        n_embd = model.config.n_embd
        if in_proj is None or out_proj is None:
            raise ValueError(f"layer {il} lacks shortconv.in_proj or shortconv.out_proj weights")
        if in_proj.rows != 3 * n_embd:
            raise ValueError(f"layer {il}: shortconv.in_proj has {in_proj.rows} rows, expected {3 * n_embd}")
        conv = model.vec(p + "conv.weight").reshape(n_embd, -1)
        if conv.shape[1] < 2:
            raise ValueError(f"layer {il}: shortconv.conv needs at least 2 taps")
        return cls(in_proj, conv, out_proj)

    @property
    def d_conv(self) -> int:
        """The inputs a sequence's state keeps: the taps before the current token's."""
        return self.conv.shape[1] - 1

    def forward(
        self, model: DecoderModel, il: int, ws: Workspace, batch: Batch, kv: KVCache, placed: Placement
    ) -> None:
        """The block from ``ws.h`` (normed, ``batch.n`` rows) to ``ws.o``, each token's sequence state
        read and advanced in batch order."""
        n, d = batch.n, model.config.n_embd
        b = ws.mixer
        assert isinstance(b, ShortConvBuffers)
        pi = kv.pool_index(il)
        state = kv.pools[pi].k[il]  # [n_seq, n_embd * d_conv]
        ws.h.rows(n)
        self.in_proj.matmul(ws.h, out=b.bcx[:n])
        short_conv(b.y.x, b.bcx, state, self.conv, placed.cells[pi], n, d, self.d_conv)
        b.y.rows(n)
        self.out_proj.matmul(b.y, out=ws.o[:n])


@numba.njit(cache=True, nogil=True)
def short_conv(y, bcx, state, w, rows, n, d, d_conv):  # type: ignore[no-untyped-def]
    """y[t] = c * conv(b * x) for each token t of state row rows[t], the state advanced by its input.

    y: [n, d]; bcx: [n, 3 * d] (b | c | x); state: [n_seq, d * d_conv], each channel's last d_conv inputs
    oldest first; w: [d, d_conv + 1]. The taps sum in float from the oldest input (ggml_ssm_conv)."""
    for t in range(n):
        st = state[rows[t]]
        for ch in range(d):
            bx = bcx[t, ch] * bcx[t, 2 * d + ch]
            base = ch * d_conv
            acc = np.float32(0.0)
            for k in range(d_conv):
                acc += st[base + k] * w[ch, k]
            acc += bx * w[ch, d_conv]
            for k in range(d_conv - 1):
                st[base + k] = st[base + k + 1]
            st[base + d_conv - 1] = bx
            y[t, ch] = bcx[t, d + ch] * acc
