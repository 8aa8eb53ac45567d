"""The dense FFN layer kind: llama.cpp's build_ffn with a parallel gate (SwiGLU or GeGLU).

Its matrices are ExactMatrix (rows = output features). The file's ``ffn_gate`` and ``ffn_up`` are stacked
at load into one [gate | up] matrix where they run one kernel (one launch, the same numbers); phi3's file
already holds them fused in ``ffn_up``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llama_quant.kernels import Activations, ExactMatrix

from .. import ops

if TYPE_CHECKING:
    from ..arch.base import DecoderModel
    from ..arch.workspace import Rows, Workspace

__all__ = ["DenseFFN"]


@dataclass(slots=True)
class DenseFFN:
    """One layer's gated FFN: ``down(act(gate(x)) * up(x))``."""

    w_gate: ExactMatrix | None  # [n_ff, n_embd]; None: gate and up are both in w_up
    w_up: ExactMatrix  # [n_ff, n_embd], or [2 * n_ff, n_embd] holding [gate | up]
    w_down: ExactMatrix  # [n_embd, n_ff]
    activation: str  # "silu" (SwiGLU) or "gelu" (GeGLU)
    gate_stacked: bool  # w_up stacks the file's separate ffn_gate and ffn_up (else: the file's fused up)

    @classmethod
    def load(cls, model: DecoderModel, il: int, activation: str) -> DenseFFN:
        """Layer ``il``'s ``ffn_gate``, ``ffn_up`` and ``ffn_down`` from the model's file."""
        p = f"blk.{il}."
        up = model.stacked([p + "ffn_gate.weight", p + "ffn_up.weight"])  # [gate | up]: one launch
        gate = None
        stacked = up is not None
        if up is None:
            gate = model.matrix(p + "ffn_gate.weight")
            up = model.matrix(p + "ffn_up.weight")
        down = model.matrix(p + "ffn_down.weight")
        if up is None or down is None:
            raise ValueError(f"layer {il} lacks ffn_up or ffn_down weights")
        return cls(gate, up, down, activation, stacked)

    @property
    def n_ff(self) -> int:
        return self.w_down.cols

    def forward(self, model: DecoderModel, il: int, ws: Workspace, n: int) -> None:
        """The FFN from ``ws.h`` (the normed input, ``n`` rows) to ``ws.o``."""
        ws = ws.for_ffn(self.n_ff)  # a layer narrower than the model's widest: buffers of its width
        rows = ws.rows(n)
        h = _fresh(ws.h, n)
        n_ff = self.n_ff
        if model.collector is not None:
            model.collector.observe(il, "ffn_in", h.x[:n])
        if self.w_gate is None:  # fused gate+up: [n, 2 * n_ff]
            self.w_up.matmul(h, out=rows.gu)
            gate, up, up_col = ws.gu, ws.gu, n_ff
        else:
            assert rows.gate is not None and rows.up is not None
            self.w_gate.matmul(h, out=rows.gate)
            self.w_up.matmul(h, out=rows.up)
            g, u = ws.gate_up_parts  # the whole buffers: the kernel takes n
            assert g is not None and u is not None
            gate, up = g, u
            up_col = 0
        if model.loras:
            self._lora_gate_up(model, il, h.x[:n], rows, n_ff)
        glu = ops.geglu if self.activation == "gelu" else ops.swiglu
        glu(ws.glu.x, gate, up, n, n_ff, 0, up_col)
        if model.collector is not None:
            model.collector.observe(il, "ffn_down", ws.glu.x[:n])
        self.w_down.matmul(_fresh(ws.glu, n), out=rows.o)
        if model.loras:
            model.add_lora(il, "ffn_down", ws.glu.x[:n], rows.o)

    def _lora_gate_up(self, model: DecoderModel, il: int, x, rows: Rows, n_ff: int) -> None:  # type: ignore[no-untyped-def]
        if rows.gate is not None and rows.up is not None and self.w_gate is not None:  # separate products
            model.add_lora(il, "ffn_gate", x, rows.gate)
            model.add_lora(il, "ffn_up", x, rows.up)
        elif self.gate_stacked:  # stacked at load: [gate | up]
            model.add_lora(il, "ffn_gate", x, rows.gu[:, :n_ff])
            model.add_lora(il, "ffn_up", x, rows.gu[:, n_ff:])
        else:  # the file's fused up (phi3): one weight for both halves
            model.add_lora(il, "ffn_up", x, rows.gu)


def _fresh(acts: Activations, n: int) -> Activations:
    """``acts`` after its f32 rows were written: ``n`` rows, earlier conversions forgotten."""
    acts.rows(n)
    return acts
