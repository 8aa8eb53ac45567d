"""The mixture-of-experts FFN layer kind: llama.cpp's build_moe_ffn.

A router (``ffn_gate_inp``, [n_expert, n_embd]) scores the experts per token; gating (softmax, sigmoid,
or softmax over the chosen ones) turns the scores into probabilities, the top ``n_expert_used`` are
chosen as ggml_argsort orders them, and their probabilities, optionally normalised to sum 1 and scaled,
weigh the chosen experts' SwiGLU FFNs. The expert tensors ``ffn_{gate,up,down}_exps`` are 3-D
([n_expert] x a 2-D matrix in the file); each expert's slice is one ExactMatrix, its gate and up stacked
into one where they run one kernel, all experts in one ``ExpertMatrix``. A batch is grouped by expert
(ggml_mul_mat_id's row lists): each chosen expert's weights are read once per step, for all the tokens
that chose it (one launch for every chosen expert where the type has a grouped kernel), and every product
row is the number a single token gets. Optional shared experts (``ffn_{gate,up,down}_shexp``) run on
every token and are added after the routed ones, gated by ``ffn_gate_inp_shexp`` where the file has it.

gpt-oss adds biases: the router's (``ffn_gate_inp.bias``, added to its logits) and each expert's
(``ffn_{gate,up,down}_exps.bias``, [n_expert, rows]: ggml_add_id, the chosen expert's row added to its
product), and its activation is ``swiglu_oai`` (ggml_swiglu_oai: the gate clamped above and the up value
on both sides at ``limit``, x * sigmoid(alpha * x) * (up + 1)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numba
import numpy as np

from gguf_io import ModelHeader
from llama_quant.kernels import Activations, ExactMatrix, ExpertMatrix

from .. import ops
from .routing import Gating, group_by_expert, route, weighted_sum

if TYPE_CHECKING:
    from ..arch.base import DecoderModel
    from ..arch.workspace import Workspace

__all__ = ["OAI_ALPHA", "OAI_LIMIT", "MoE", "MoEBuffers", "MoEConfig", "swiglu_oai"]

# build_moe_ffn's LLM_FFN_SWIGLU_OAI_MOE constants (fixed in llama.cpp, not read from the file)
OAI_ALPHA = 1.702
OAI_LIMIT = 7.0


@dataclass(frozen=True, slots=True)
class MoEConfig:
    """What build_moe_ffn takes besides the tensors (an architecture fixes some of it as llama.cpp does)."""

    n_expert: int
    n_expert_used: int
    gating: Gating = Gating.SOFTMAX
    norm_weights: bool = False  # divide the chosen weights by their sum (expert_weights_norm)
    weights_scale: float = 0.0  # multiply them by this, unless 0 or 1 (expert_weights_scale)
    activation: str = "silu"  # "silu" (SwiGLU) or "swiglu_oai" (gpt-oss: OAI_ALPHA, OAI_LIMIT)

    @classmethod
    def from_header(cls, h: ModelHeader, **fixed: object) -> MoEConfig:
        """``<arch>.expert_count`` and ``expert_used_count`` (both required), with ``fixed`` the rest."""
        n, k = h.expert_count or 0, h.expert_used_count or 0
        if n < 1 or not 0 < k <= n:
            raise ValueError(
                f"{h.architecture} needs {h.architecture}.expert_count >= 1 and 1 <= expert_used_count <= "
                f"expert_count, got {h.expert_count} and {h.expert_used_count}"
            )
        return cls(n, k, **fixed)  # type: ignore[arg-type]


class MoEBuffers:
    """The MoE layers' scratch for up to ``n_batch`` tokens (one set per model, shared by its layers)."""

    __slots__ = (
        "active",
        "experts",
        "gate",
        "glu",
        "gu",
        "logits",
        "offsets",
        "ones",
        "order",
        "pairs",
        "probs",
        "scratch_ff",
        "scratch_in",
        "selected",
        "sh_gate",
        "sh_glu",
        "sh_gu",
        "sh_out",
        "sh_silu",
        "up",
        "weights",
    )

    def __init__(
        self,
        n_batch: int,
        n_embd: int,
        cfg: MoEConfig,
        n_ff: int,
        n_ff_shared: int,
        split: bool,
        grouped: bool,
    ) -> None:
        f32, n, e, k = np.float32, n_batch, cfg.n_expert, cfg.n_expert_used
        self.logits = np.zeros((n, e), f32)  # the router's scores
        self.probs = np.zeros((n, e), f32)  # after gating
        self.order = np.zeros((n, e), np.int32)  # experts by probability, largest first
        self.selected = np.zeros((n, k), np.int32)
        self.weights = np.zeros((n, k), f32)
        self.offsets = np.zeros(e + 1, np.int64)  # expert e's pairs: pairs[offsets[e]:offsets[e + 1]]
        self.pairs = np.zeros(n * k, np.int64)  # token * k + slot, grouped by expert
        self.active = np.zeros(e, np.int64)  # the experts chosen by any token this step
        nk = n * k  # a row per (token, slot) pair
        self.gu = np.zeros((nk, 0 if split else 2 * n_ff), f32)  # [gate | up] of every pair
        self.gate = np.zeros((nk, n_ff if split else 0), f32)
        self.up = np.zeros((nk, n_ff if split else 0), f32)
        self.glu = Activations(n_ff, nk)
        self.experts = np.zeros((nk, n_embd), f32)  # every pair's expert output
        # one expert's tokens at a time, for the expert types without a grouped kernel
        self.scratch_in: tuple[Activations, np.ndarray] | None = None
        self.scratch_ff: tuple[Activations, np.ndarray] | None = None
        if not grouped:
            self.scratch_in = Activations(n_embd, n), np.zeros((n, n_ff if split else 2 * n_ff), f32)
            self.scratch_ff = Activations(n_ff, n), np.zeros((n, n_embd), f32)
        self.sh_gu = np.zeros((n, 2 * n_ff_shared), f32)  # the shared expert's [gate | up]
        self.sh_glu = Activations(n_ff_shared, n)
        self.sh_out = np.zeros((n, n_embd if n_ff_shared else 0), f32)
        self.sh_gate = np.zeros((n, 1), f32)  # the shared expert's gate logit
        self.sh_silu = np.zeros((n, 1), f32)  # and its silu(g) / g
        self.ones = np.ones((n, 1), f32)


@dataclass(slots=True)
class MoE:
    """One layer's routed experts (and shared ones, where the file has them)."""

    config: MoEConfig
    router: ExactMatrix  # [n_expert, n_embd]: ffn_gate_inp
    gate_up: ExpertMatrix | None  # per expert [2 * n_ff, n_embd]: [gate | up] stacked
    gate: ExpertMatrix | None  # per expert [n_ff, n_embd], when gate and up do not stack
    up: ExpertMatrix | None
    down: ExpertMatrix  # per expert [n_embd, n_ff]
    shared: ExactMatrix | None = None  # [2 * n_ff_shared, n_embd]: the shared expert's [gate | up]
    shared_down: ExactMatrix | None = None  # [n_embd, n_ff_shared]
    shared_gate: ExactMatrix | None = None  # [1, n_embd]: ffn_gate_inp_shexp
    router_bias: np.ndarray | None = None  # [n_expert]: ffn_gate_inp.bias
    gate_bias: np.ndarray | None = None  # [n_expert, n_ff]: ffn_gate_exps.bias
    up_bias: np.ndarray | None = None  # [n_expert, n_ff]: ffn_up_exps.bias
    down_bias: np.ndarray | None = None  # [n_expert, n_embd]: ffn_down_exps.bias

    @classmethod
    def load(cls, model: DecoderModel, il: int, cfg: MoEConfig) -> MoE:
        """Layer ``il``'s router, experts and shared experts from the model's file."""
        p = f"blk.{il}."
        router = model.matrix(p + "ffn_gate_inp.weight")
        if router is None or router.rows != cfg.n_expert:
            raise ValueError(f"layer {il} lacks ffn_gate_inp.weight of {cfg.n_expert} experts")
        names = [p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight"]
        gate_up = model.expert_matrices(names, cfg.n_expert)
        gate = up = None
        if gate_up is None:
            gate = model.expert_matrices(names[:1], cfg.n_expert)
            up = model.expert_matrices(names[1:], cfg.n_expert)
        down = model.expert_matrices([p + "ffn_down_exps.weight"], cfg.n_expert)
        if down is None or (gate_up is None and (gate is None or up is None)):
            raise ValueError(f"layer {il} lacks ffn_gate_exps, ffn_up_exps or ffn_down_exps weights")
        shared = model.stacked([p + "ffn_gate_shexp.weight", p + "ffn_up_shexp.weight"])
        shared_down = model.matrix(p + "ffn_down_shexp.weight")
        if (shared is None) != (shared_down is None):
            raise ValueError(
                f"layer {il}'s shared expert lacks ffn_gate_shexp, ffn_up_shexp or ffn_down_shexp"
            )
        n_ff, n_embd = down.cols, down.rows
        return cls(
            cfg,
            router,
            gate_up,
            gate,
            up,
            down,
            shared,
            shared_down,
            model.row(p + "ffn_gate_inp_shexp.weight"),
            _bias(model, p + "ffn_gate_inp.bias", 1, cfg.n_expert),
            _bias(model, p + "ffn_gate_exps.bias", cfg.n_expert, n_ff),
            _bias(model, p + "ffn_up_exps.bias", cfg.n_expert, n_ff),
            _bias(model, p + "ffn_down_exps.bias", cfg.n_expert, n_embd),
        )

    @property
    def n_ff(self) -> int:
        return self.down.cols

    @property
    def n_ff_shared(self) -> int:
        return 0 if self.shared_down is None else self.shared_down.cols

    @property
    def layout(self) -> tuple[MoEConfig, int, int, bool, bool]:
        """What the layer's buffers depend on: layers of one layout share one ``MoEBuffers``."""
        mats = [self.down, *(m for m in (self.gate_up, self.gate, self.up) if m is not None)]
        return self.config, self.n_ff, self.n_ff_shared, self.gate_up is None, all(m.grouped for m in mats)

    def buffers(self, n_batch: int, n_embd: int) -> MoEBuffers:
        return MoEBuffers(n_batch, n_embd, *self.layout)

    def forward(self, model: DecoderModel, il: int, ws: Workspace, n: int) -> None:
        """The layer from ``ws.h`` (the normed input, ``n`` rows) to ``ws.o``."""
        b, cfg = ws.moe, self.config
        assert b is not None
        h = ws.h
        h.rows(n)
        k, d = cfg.n_expert_used, h.cols
        self.router.matmul(h, out=b.logits[:n])
        if self.router_bias is not None:  # ffn_moe_logits_biased
            np.add(b.logits[:n], self.router_bias, out=b.logits[:n])
        route(
            b.logits,
            b.probs,
            b.order,
            b.selected,
            b.weights,
            n,
            cfg.n_expert,
            k,
            int(cfg.gating),
            cfg.norm_weights,
            np.float32(cfg.weights_scale),
        )
        m = group_by_expert(b.selected, n, k, cfg.n_expert, b.offsets, b.pairs, b.active)
        grouping = (b.pairs, b.offsets, b.active, m)
        nk, n_ff = n * k, self.n_ff
        if self.gate_up is not None:  # every pair's [gate | up], each expert once for its tokens
            self.gate_up.matmul(h, b.gu, *grouping, k, b.scratch_in)
            gate, up, up_col = b.gu, b.gu, n_ff
        else:
            assert self.gate is not None and self.up is not None
            self.gate.matmul(h, b.gate, *grouping, k, b.scratch_in)
            self.up.matmul(h, b.up, *grouping, k, b.scratch_in)
            gate, up, up_col = b.gate, b.up, 0
        chosen = b.selected[:n].reshape(nk)  # pair t * k + i's expert
        if self.up_bias is not None:  # ffn_moe_up_biased, then ffn_moe_gate_biased (ggml_add_id)
            up[:nk, up_col : up_col + n_ff] += self.up_bias[chosen]
        if self.gate_bias is not None:
            gate[:nk, :n_ff] += self.gate_bias[chosen]
        if cfg.activation == "swiglu_oai":
            alpha, limit = np.float32(OAI_ALPHA), np.float32(OAI_LIMIT)
            swiglu_oai(b.glu.x, gate, up, nk, n_ff, 0, up_col, alpha, limit)
        else:
            ops.swiglu(b.glu.x, gate, up, nk, n_ff, 0, up_col)
        b.glu.rows(nk)
        self.down.matmul(b.glu, b.experts, *grouping, 1, b.scratch_ff)
        if self.down_bias is not None:
            b.experts[:nk] += self.down_bias[chosen]
        weighted_sum(ws.o, b.experts, b.weights, n, k, d)
        if self.shared is not None:
            self._shared(b, ws, n)

    def _shared(self, b: MoEBuffers, ws: Workspace, n: int) -> None:
        """ws.o += the shared expert's FFN, times silu(g) / g of its gate's logit g where it has one
        (qwen2moe's sigmoid)."""
        assert self.shared is not None and self.shared_down is not None
        h, n_ff = ws.h, self.n_ff_shared
        self.shared.matmul(h, out=b.sh_gu[:n])
        ops.swiglu(b.sh_glu.x, b.sh_gu, b.sh_gu, n, n_ff, 0, n_ff)
        b.sh_glu.rows(n)
        out = b.sh_out[:n]
        self.shared_down.matmul(b.sh_glu, out=out)
        if self.shared_gate is not None:
            g, gate = b.sh_gate[:n], b.sh_silu[:n]  # [n, 1]
            self.shared_gate.matmul(h, out=g)
            ops.swiglu(b.sh_silu, b.sh_gate, b.ones, n, 1)  # silu(g) * 1: ggml_silu's scalar form
            np.divide(gate, g, out=gate)
            np.multiply(out, gate, out=out)
        np.add(ws.o[:n], out, out=ws.o[:n])


def _bias(model: DecoderModel, name: str, n_rows: int, n: int) -> np.ndarray | None:
    """The bias ``name`` as float32 [n_rows, n] (a vector when n_rows is 1), or None when absent."""
    v = model.vec_or_none(name)
    if v is None:
        return None
    if v.size != n_rows * n:
        raise ValueError(f"tensor {name} has {v.size} values, expected {n_rows} x {n}")
    return v if n_rows == 1 else v.reshape(n_rows, n)


@numba.njit(cache=True, nogil=True)
def swiglu_oai(out, gate, up, n, d, gate_col, up_col, alpha, limit):  # type: ignore[no-untyped-def]
    """out[t, :d] = ggml_swiglu_oai of the gate values gate[t, gate_col:][:d] and the up values
    up[t, up_col:][:d], t < n: x = min(g, limit), y = clamp(u, -limit, limit) (std::min, std::clamp),
    x / (1 + expf(alpha * -x)) * (y + 1), every step in float, libm's expf (the op has no vector form)."""
    one = np.float32(1.0)
    lo = -limit
    for t in range(n):
        for i in range(d):
            x = gate[t, gate_col + i]
            x = limit if limit < x else x
            y = up[t, up_col + i]
            y = lo if y < lo else (limit if limit < y else y)
            glu = x / (one + np.float32(math.exp(alpha * -x)))
            out[t, i] = glu * (y + one)
