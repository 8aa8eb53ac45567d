"""gemma4: Gemma 4's text decoder (llama.cpp's models/gemma4.cpp).

Gemma 3's block (GeGLU, post-attention and post-FFN norms, embeddings scaled by sqrt(n_embd), final logit
soft-capping) with: sliding-window layers chosen per layer by ``attention.sliding_window_pattern``, their
own head size (``attention.key_length_swa``), RoPE dimensions and base; global layers rotated with the
``rope_freqs`` factors (proportional RoPE); V normed per head without a weight; no attention scaling (the
per-head Q/K norms set the scale); the last ``attention.shared_kv_layers`` layers keep no keys and values
and attend over those of the last stored layer of their kind; per-layer input embeddings
(``per_layer_token_embd`` plus a projection of the embeddings, gated into each layer's output); an
optional scalar on each layer's output (``layer_output_scale``); each layer's own feed-forward length
(``feed_forward_length`` may be per layer: E2B/E4B's wider MLP on the layers sharing keys and values).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numba
import numpy as np

from gguf_io import GGUFFile, ModelHeader
from llama_quant import dequantize
from llama_quant.cpu import KernelSet
from llama_quant.kernels import Activations, ExactMatrix

from .. import ops
from ..batch import Batch
from ..kv_cache import KVCache, Placement
from ..ops.norm import rms_norm_row
from .base import DecoderModel, LayerWeights, ModelConfig, Suspension, _fresh, _vec, register
from .rope_scaling import freq_factors
from .workspace import EMPTY, Workspace

__all__ = ["Gemma4"]

_NO_CELLS = np.zeros(0, np.int32)  # a layer reading another layer's cache stores nothing


@dataclass(frozen=True, slots=True)
class _Geometry:
    """One layer's attention shape and where its keys and values live."""

    swa: bool
    n_head_kv: int
    head_dim: int
    rope_dims: int
    kv_layer: int  # the layer whose cache it reads: itself, or the last stored layer of its kind


@dataclass(slots=True)
class _PerLayerInput:
    """The per-layer input embeddings' weights: the model's and one layer's."""

    gate: ExactMatrix  # blk.N.inp_gate: [n_embd_per_layer, n_embd]
    proj: ExactMatrix  # blk.N.proj: [n_embd, n_embd_per_layer]
    post_norm: np.ndarray  # blk.N.post_norm: [n_embd]


class _Scratch:
    """The buffers of gemma4's own steps for up to ``n_batch`` tokens (allocated once per batch size)."""

    def __init__(
        self, n_batch: int, n_embd: int, widths: dict[int, tuple[int, int]], n_pl: int, n_layer: int
    ):
        f32 = np.float32
        self.n_batch = n_batch
        # per head size: q | k | v [n, q_dim + 2 * kv_dim], its parts, q as attention reads it, its output
        self.qkv = {hd: np.zeros((n_batch, q + 2 * k), f32) for hd, (q, k) in widths.items()}
        self.parts = {
            hd: tuple(np.zeros((n_batch, d), f32) for d in (q, k, k)) for hd, (q, k) in widths.items()
        }
        self.q = {hd: np.zeros((n_batch, q), f32) for hd, (q, _) in widths.items()}
        self.attn = {hd: Activations(q, n_batch) for hd, (q, _) in widths.items()}
        self.x = Activations(n_embd, n_batch)  # the residual stream as a product's input
        self.pl = np.zeros((n_layer, n_batch, n_pl), f32)  # per-layer inputs [n_layer, n, n_embd_per_layer]
        self.pl_proj = np.zeros((n_batch, n_layer * n_pl), f32)
        self.gate = np.zeros((n_batch, n_pl), f32)
        self.glu = Activations(n_pl, n_batch)
        self.ones = {hd: np.ones(hd, f32) for hd in widths}  # the V norm's weight: x * scale * 1 is x * scale


@register("gemma4")
class Gemma4(DecoderModel):
    rope_mode = ops.ROPE_NEOX
    activation = "gelu"

    def __init__(
        self, gguf: GGUFFile, kernels: KernelSet | str | None = None, exact_floats: bool | None = None
    ) -> None:
        super().__init__(gguf, kernels, exact_floats)
        meta, c, a = gguf.metadata, self.config, self.arch + "."
        pattern = meta.get(a + "attention.sliding_window_pattern")
        if pattern is None or len(pattern) < c.n_layer:
            raise ValueError("gemma4 needs attention.sliding_window_pattern with one entry per layer")
        swa = [bool(pattern[il]) for il in range(c.n_layer)] if c.swa_window else [False] * c.n_layer
        n_kv = c.n_layer - int(meta.get(a + "attention.shared_kv_layers", 0))
        if n_kv < c.n_layer and n_kv < 2:
            raise ValueError("gemma4 shares keys and values from at least two stored layers")
        hd_swa = int(meta.get(a + "attention.key_length_swa", c.head_dim))
        if int(meta.get(a + "attention.value_length_swa", hd_swa)) != hd_swa or c.head_dim_v != c.head_dim:
            raise ValueError("gemma4 needs equal key and value head sizes")
        rot_swa = int(meta.get(a + "rope.dimension_count_swa", c.rope_dims))
        kv_heads = self.header.head_count_kv
        geo = []
        for il in range(c.n_layer):
            src = il if il < n_kv else n_kv - (2 if swa[il] else 1)  # llama.cpp's layer_reuse_cb
            n_head_kv = kv_heads[il] if isinstance(kv_heads, tuple) else kv_heads
            hd, rot = (hd_swa, rot_swa) if swa[il] else (c.head_dim, c.rope_dims)
            geo.append(_Geometry(swa[il], n_head_kv, hd, rot, src))
        self.geometry = geo
        # a cache row holds the widest kind's keys: each kind keeps one width (the KV cache's kv_dim)
        stored = geo[:n_kv]
        for kind in (True, False):
            if len({(g.n_head_kv, g.head_dim) for g in stored if g.swa == kind}) > 1:
                raise ValueError(
                    "gemma4 layers of one kind with different key/value shapes are not supported"
                )
        widest = max(stored, key=lambda g: g.n_head_kv * g.head_dim)
        self.config = dataclasses.replace(
            c,
            swa_layers=frozenset(il for il in range(c.n_layer) if swa[il]),
            rope_base_swa=self.header.rope_freq_base_swa or 10000.0,
            n_head_kv=widest.n_head_kv,
            head_dim=widest.head_dim,
            head_dim_v=widest.head_dim,
        )
        self.n_layer_kv = n_kv
        self.out_scale = [self._scalar(f"blk.{il}.layer_output_scale.weight") for il in range(c.n_layer)]
        self.n_embd_per_layer = int(meta.get(a + "embedding_length_per_layer_input", 0))
        self._load_per_layer_inputs()
        widths = {g.head_dim: (c.n_head * g.head_dim, g.n_head_kv * g.head_dim) for g in geo}
        self._widths = widths
        self._scratch: _Scratch | None = None
        self._release_pages()

    @classmethod
    def make_config(cls, h: ModelHeader) -> ModelConfig:
        # head_count_kv may be per layer: the constructor takes each layer's own
        kv = h.head_count_kv
        c = super().make_config(
            dataclasses.replace(h, head_count_kv=max(kv) if isinstance(kv, tuple) else kv)
        )
        return dataclasses.replace(
            c,
            swa_window=h.sliding_window or None,
            attn_scale=1.0,  # f_attention_scale = 1: the Q/K norms replace 1/sqrt(head_dim)
            embed_scale=float(np.sqrt(np.float32(c.n_embd))),
        )

    def _scalar(self, name: str) -> np.float32 | None:
        v = self.vec_or_none(name)
        return None if v is None else np.float32(v[0])

    def _load_per_layer_inputs(self) -> None:
        c, n_pl = self.config, self.n_embd_per_layer
        self._ple: list[_PerLayerInput] | None = None
        if n_pl <= 0:
            return
        info = self._gguf.tensors.get("per_layer_token_embd.weight")
        model_proj = self.matrix("per_layer_model_proj.weight")
        if info is None or model_proj is None:
            raise ValueError(
                "gemma4 with per-layer inputs lacks per_layer_token_embd or per_layer_model_proj"
            )
        self._pl_embd_type = info.ggml_type
        self._pl_embd_raw = self._gguf.tensor_bytes("per_layer_token_embd.weight")  # read lazily, by row
        self._pl_row_bytes = self._pl_embd_raw.nbytes // c.n_vocab
        self._pl_model_proj = model_proj  # [n_layer * n_embd_per_layer, n_embd]
        self._pl_proj_norm = self.vec("per_layer_proj_norm.weight")  # [n_embd_per_layer]
        ple = []
        for il in range(c.n_layer):
            p = f"blk.{il}."
            gate, proj = self.matrix(p + "inp_gate.weight"), self.matrix(p + "proj.weight")
            if gate is None or proj is None:
                raise ValueError(f"layer {il} lacks its per-layer input weights (inp_gate, proj)")
            ple.append(_PerLayerInput(gate, proj, self.vec(p + "post_norm.weight")))
        self._ple = ple

    def load_layer(self, il: int) -> LayerWeights:
        p = f"blk.{il}."
        if self.has(p + "ffn_gate_inp.weight"):
            raise ValueError("gemma4 with mixture-of-experts layers is not supported")
        lw = super().load_layer(il)
        if lw.wqkv is None and lw.wq is not None and lw.wk is not None and not self.has(p + "attn_v.weight"):
            lw.wv = None  # use_alternative_attention: the values are the keys (before their norms)
        if lw.post_attn_norm is None or lw.post_ffn_norm is None or lw.q_norm is None:
            raise ValueError(f"layer {il} lacks gemma4's post-attention, post-FFN or Q norm")
        return lw

    # -- cache -------------------------------------------------------------------------------------------

    def kv_layers(self) -> list[int]:
        """The layers that store keys and values: the first n_layer_kv (the shared ones read them)."""
        return list(range(self.n_layer_kv))

    def make_kv_cache(
        self,
        n_ctx: int,
        n_seq_max: int = 1,
        n_ubatch: int = 512,
        swa_full: bool = False,
        type_k: str = "f16",
        type_v: str = "f16",
        flash_attn: bool = False,
    ) -> KVCache:
        """Keys and values of the stored layers only (``kv_layers``); f32 and f16 caches."""
        if flash_attn or type_k not in ("f16", "f32") or type_v not in ("f16", "f32"):
            raise ValueError("gemma4 runs with f16 or f32 K/V caches without flash attention")
        return super().make_kv_cache(n_ctx, n_seq_max, n_ubatch, swa_full, type_k, type_v, flash_attn)

    def rope_cache(self, il: int, n_pos: int) -> np.ndarray:
        c, g = self.config, self.geometry[il]
        base = c.rope_base_swa if g.swa else c.rope_base
        table = self._rope.get((base, g.swa))
        if table is None or len(table) < n_pos:
            scaling = self.rope_scaling
            if g.swa:  # rope_freq_scale_train_swa: 1; no frequency factors on sliding-window layers
                scaling, ff = dataclasses.replace(scaling, freq_scale=1.0), None
            else:  # proportional RoPE: rope_freqs on the global layers
                ff = freq_factors(self._rope_factors, self.n_ctx_seq, scaling.n_ctx_orig)
            args = scaling.table_args(g.rope_dims, base)
            table = ops.rope_cache(max(n_pos, 4096), g.rope_dims, base, **args, freq_factors=ff)
            self._rope[(base, g.swa)] = table
        return table

    def shift_k(self, il: int, k: np.ndarray, cells: np.ndarray, delta: int) -> None:
        g = self.geometry[il]
        nk = g.n_head_kv * g.head_dim
        rows = np.ascontiguousarray(k[cells, :nk].astype(np.float32))
        table = self.rope_cache(il, abs(delta) + 1)
        if delta < 0:
            table = table.copy()
            table[:, :, 1] *= -1
        pos = np.full(len(cells), abs(delta), np.int32)
        ops.rope(rows, pos, table, len(cells), g.n_head_kv, g.head_dim, g.rope_dims, self.rope_mode)
        k[cells, :nk] = rows

    # -- forward -----------------------------------------------------------------------------------------

    def workspace(self, n_batch: int) -> Workspace:
        ws = super().workspace(n_batch)
        s = self._scratch
        if s is None or s.n_batch < ws.n_batch:
            c = self.config
            n_pl = max(self.n_embd_per_layer, 0)
            self._scratch = _Scratch(ws.n_batch, c.n_embd, self._widths, n_pl, c.n_layer)
        return ws

    def embed(self, tokens: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The scaled token embeddings and, for a model with per-layer inputs, the batch's per-layer
        inputs from them and the tokens (build_inp_per_layer, project_per_layer_inputs)."""
        x = super().embed(tokens, out)
        if self._ple is not None and len(tokens):
            self._per_layer_inputs(tokens, x)
        return x

    def suspend(self, ws: Workspace, n: int, layer: int, placed: Placement) -> Suspension:
        """With per-layer inputs, the later layers' rows of them go along."""
        s = super().suspend(ws, n, layer, placed)
        if self._ple is not None and self._scratch is not None:
            s.extra = self._scratch.pl[layer:, :n].copy()
        return s

    def restore(self, ws: Workspace, n: int, s: Suspension) -> None:
        super().restore(ws, n, s)
        if s.extra is not None and self._scratch is not None:
            self._scratch.pl[s.layer :, :n] = s.extra

    def _per_layer_inputs(self, tokens: np.ndarray, x: np.ndarray) -> None:
        c, n, n_pl = self.config, len(tokens), self.n_embd_per_layer
        self.workspace(n)
        s = self._scratch
        assert s is not None
        width = c.n_layer * n_pl
        rows = self._pl_embd_raw.reshape(c.n_vocab, self._pl_row_bytes)[tokens]
        sel = dequantize(rows, self._pl_embd_type, (n, width)).astype(np.float32, copy=False)
        sel = sel * np.float32(math.sqrt(np.float32(n_pl)))  # sqrtf(n_embd_per_layer)
        np.copyto(s.x.x[:n], x)
        proj = s.pl_proj[:n]
        self._pl_model_proj.matmul(_fresh(s.x, n), out=proj)
        proj *= np.float32(1.0) / np.sqrt(np.float32(c.n_embd))
        flat = proj.reshape(n * c.n_layer, n_pl)
        ops.rms_norm(flat, flat, self._pl_proj_norm, c.rms_eps, n * c.n_layer, n_pl)
        proj += sel
        proj *= np.float32(1.0) / np.sqrt(np.float32(2.0))
        s.pl[:, :n] = proj.reshape(n, c.n_layer, n_pl).transpose(1, 0, 2)

    def block(self, il: int, ws: Workspace, batch: Batch, kv: KVCache, placed: Placement) -> None:
        n, c, lw = batch.n, self.config, self.layers[il]
        eps, d = c.rms_eps, c.n_embd
        self.attention(il, ws, batch, kv, placed)
        assert lw.ffn_norm is not None
        ops.residual_norm(ws.x, ws.o, EMPTY, _vec(lw.post_attn_norm), lw.ffn_norm, ws.h.x, eps, n, d)
        self.ffn(il, ws, n)
        nxt = self.layers[il + 1].attn_norm if il + 1 < c.n_layer else EMPTY
        scale = self.out_scale[il]
        last = EMPTY if self._ple is not None or scale is not None else nxt
        ops.residual_norm(ws.x, ws.o, EMPTY, _vec(lw.post_ffn_norm), last, ws.h.x, eps, n, d)
        if self._ple is not None:
            self._per_layer_input(il, ws, n, EMPTY if scale is not None else nxt)
        if scale is not None:
            x = ws.x[:n]
            np.multiply(x, scale, out=x)
            if len(nxt):
                ops.rms_norm(ws.h.x, ws.x, nxt, eps, n, d)

    def _per_layer_input(self, il: int, ws: Workspace, n: int, nxt: np.ndarray) -> None:
        """x += post_norm(proj(gelu(inp_gate(x)) * per-layer input)); then the next layer's norm."""
        s, c = self._scratch, self.config
        assert s is not None and self._ple is not None
        ple, n_pl = self._ple[il], self.n_embd_per_layer
        np.copyto(s.x.x[:n], ws.x[:n])
        ple.gate.matmul(_fresh(s.x, n), out=s.gate[:n])
        ops.geglu(s.glu.x, s.gate, s.pl[il], n, n_pl)  # gelu(gate) * the layer's input
        ple.proj.matmul(_fresh(s.glu, n), out=ws.o[:n])
        ops.residual_norm(ws.x, ws.o, EMPTY, ple.post_norm, nxt, ws.h.x, c.rms_eps, n, c.n_embd)

    def attention(self, il: int, ws: Workspace, batch: Batch, kv: KVCache, placed: Placement) -> None:
        lw, c, g = self.layers[il], self.config, self.geometry[il]
        s = self._scratch
        assert s is not None
        n, hd = batch.n, g.head_dim
        nq, nk = c.n_head * hd, g.n_head_kv * hd
        qkv = s.qkv[hd]
        h = _fresh(ws.h, n)
        own = g.kv_layer == il
        if self.loras:
            raise ValueError("LoRA adapters are not supported on gemma4 models")
        if self.collector is not None:
            self.collector.observe(il, "qkv", h.x[:n])
        if lw.wqkv is not None:
            lw.wqkv.matmul(h, out=qkv[:n])
        else:
            assert lw.wq is not None
            q, k, v = s.parts[hd]
            lw.wq.matmul(h, out=q[:n])
            qkv[:n, :nq] = q[:n]
            if own:
                assert lw.wk is not None
                lw.wk.matmul(h, out=k[:n])
                qkv[:n, nq : nq + nk] = k[:n]
                if lw.wv is not None:
                    lw.wv.matmul(h, out=v[:n])
                    qkv[:n, nq + nk :] = v[:n]
                else:
                    qkv[:n, nq + nk :] = k[:n]
        if own:
            _v_norms(qkv, s.ones[hd], nq + nk, n, g.n_head_kv, hd, np.float32(c.rms_eps))
        pi = kv.pool_index(g.kv_layer)
        pool, ranges = kv.cell_pool(g.kv_layer), placed.ranges[pi]
        kc, vc = pool.kernel_kv[g.kv_layer]
        attn = s.attn[hd]
        ops.attend(
            attn.x,
            qkv,
            s.q[hd],
            EMPTY,
            EMPTY,
            EMPTY,
            lw.q_norm,
            _vec(lw.k_norm) if own else EMPTY,
            np.float32(c.rms_eps),
            batch.pos,
            self.rope_cache(il, placed.n_pos),
            kc,
            vc,
            placed.cells[pi] if own else _NO_CELLS,
            ranges.cells,
            ranges.lo,
            ranges.hi,
            n,
            c.n_head,
            g.n_head_kv,
            hd,
            g.rope_dims,
            self.rope_mode,
            np.float32(1.0),
            np.float32(1.0),
            self._tile_cols,
            EMPTY,
        )
        if self.collector is not None:
            self.collector.observe(il, "attn_output", attn.x[:n])
        assert lw.wo is not None
        lw.wo.matmul(_fresh(attn, n), out=ws.rows(n).o)

    def finish_logits(self, logits: np.ndarray) -> None:
        """Final logit soft-capping in place: tanh(logits * (1 / cap)) * cap, with C's tanhf."""
        cap = self.header.final_logit_softcapping
        if cap:
            flat = logits.reshape(-1)
            _softcap(flat, np.float32(1.0) / np.float32(cap), np.float32(cap), len(flat))


@numba.njit(cache=True, nogil=True)
def _v_norms(qkv, ones, c0, n, n_head, head_dim, eps):  # type: ignore[no-untyped-def]
    """ggml_rms_norm of each head of qkv[:, c0 : c0 + n_head * head_dim] (no weight: ``ones``), in place."""
    for t in range(n):
        for h in range(n_head):
            a = c0 + h * head_dim
            row = qkv[t, a : a + head_dim]
            rms_norm_row(row, row, ones, eps, head_dim)


@numba.njit(cache=True, nogil=True)
def _softcap(x, inv, cap, n):  # type: ignore[no-untyped-def]
    """x = tanhf(x * inv) * cap (ggml_scale, ggml_tanh, ggml_scale)."""
    for i in range(n):
        x[i] = np.float32(math.tanh(x[i] * inv)) * cap
