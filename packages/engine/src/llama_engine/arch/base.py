"""The decoder-only transformer every supported architecture is a variation of, and the registry.

An architecture module subclasses `DecoderModel`, sets what differs (RoPE layout, activation, norms,
embedding scale, sliding-window layers) and registers itself under its `general.architecture` name:

    @register("llama")
    class Llama(DecoderModel): ...

The forward pass takes a `Batch` mixing sequences and returns the logits of the tokens that asked for
them. Weights stay quantized: each matrix is a `llama_quant.kernels.ExactMatrix` built for the model's
kernel set (chosen once, at load). Every step writes into one `Workspace` per model.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from gguf_io import GGMLQuantizationType, GGUFFile, ModelHeader
from llama_quant import dequantize
from llama_quant.cpu import KernelSet, resolve_exact_floats, resolve_kernel_set
from llama_quant.kernels import Activations, ExactMatrix, ExpertMatrix

from .. import ops
from ..batch import Batch
from ..kv_cache import KVCache, Placement
from ..layers import FFN, DenseFFN, Mamba2, Mamba2Buffers, MoE, ShortConv, ShortConvBuffers
from ..layers.delta_net import DeltaNet, DeltaNetBuffers
from ..lora import LoraAdapter
from ..memory import RecurrentPool
from ..ops.attention import prepare_qkv
from .rope_scaling import FREQ_FACTOR_TENSORS, freq_factors, rope_scaling
from .workspace import EMPTY, Workspace

__all__ = [
    "ARCHITECTURES",
    "DecoderModel",
    "LayerWeights",
    "ModelConfig",
    "StepInterrupted",
    "Suspension",
    "UnsupportedArchitectureError",
    "register",
]

ARCHITECTURES: dict[str, type[DecoderModel]] = {}

# The kernels release the GIL (so an HTTP thread runs while the engine computes). One forward pass at a time
# per process: numba's fallback threading layer (workqueue, when neither OpenMP nor TBB is present) aborts on
# concurrent parallel launches, and each model keeps reusable scratch buffers.
_FORWARD_LOCK = threading.Lock()

# Whether ExactMatrix takes the kernel set (the quant package's kernels= argument).
_MATRIX_KERNELS = "kernels" in inspect.signature(ExactMatrix).parameters


class ActivationCollector(Protocol):
    """Receives the f32 input rows of the matrix products of block ``il`` (-1: the output head) at
    ``site``: "qkv", "attn_output", "ffn_in" (gate and up), "ffn_down" or "output"."""

    def observe(self, il: int, site: str, x: np.ndarray) -> None: ...


class UnsupportedArchitectureError(ValueError):
    """The model's `general.architecture` has no implementation here."""


def register(name: str):
    """Register a DecoderModel subclass for `general.architecture == name`."""

    def deco(cls: type[DecoderModel]) -> type[DecoderModel]:
        cls.arch = name
        ARCHITECTURES[name] = cls
        return cls

    return deco


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Hyperparameters the forward pass uses, resolved once from the header (llama_hparams)."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    head_dim_v: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_dims: int
    rope_base: float
    rope_base_swa: float
    swa_window: int | None
    swa_layers: frozenset[int]
    attn_scale: float
    embed_scale: float


@dataclass(slots=True)
class LayerWeights:
    """One block's tensors; matrices are ExactMatrix (rows = output features), vectors float32."""

    attn_norm: np.ndarray
    wq: ExactMatrix | None
    wk: ExactMatrix | None
    wv: ExactMatrix | None
    wqkv: ExactMatrix | None
    wo: ExactMatrix | None  # None: a recurrent layer (``mixer``)
    ffn_norm: np.ndarray | None
    ffn: FFN  # the layer's FFN kind: dense (build_ffn) or mixture of experts (build_moe_ffn)
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    sinks: np.ndarray | None = None  # [n_head]: attn_sinks, each head's learned softmax sink logit
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    # a recurrent layer kind in attention's place (build_rs)
    mixer: ShortConv | Mamba2 | DeltaNet | None = None


@dataclass
class Suspension:
    """Where an interrupted forward pass stopped (`DecoderModel.interrupt`): the next layer to run, the
    residual stream and that layer's normed input of the batch's tokens, the cells they were placed in, and
    what else the architecture carries from layer to layer (`extra`). `forward(..., resume=)` goes on from
    there: the layers already run keep their work, their keys and values are in the cache."""

    layer: int
    x: np.ndarray
    h: np.ndarray
    placed: Placement
    extra: Any = None


class StepInterrupted(Exception):
    """A forward pass stopped between layers (`DecoderModel.interrupt`); `suspension` resumes it."""

    def __init__(self, suspension: Suspension) -> None:
        super().__init__(f"interrupted before layer {suspension.layer}")
        self.suspension = suspension


class DecoderModel:
    """Pre-norm decoder: attention and gated FFN blocks with residuals (llama's graph, with hooks)."""

    arch: ClassVar[str] = ""
    # Observes the activations entering each matrix product (llama-imatrix); None: no cost beyond the test.
    collector: ActivationCollector | None = None
    rope_mode: ClassVar[int] = ops.ROPE_NORM
    activation: ClassVar[str] = "silu"  # "silu" (SwiGLU) or "gelu" (GeGLU)
    # Whether sliding-window layers rotate with the file's RoPE scaling too (llama.cpp's
    # rope_freq_scale_train_swa set to rope_freq_scale_train), instead of freq_scale 1.
    swa_rope_scaled: ClassVar[bool] = False
    output_norm_name: ClassVar[str] = "output_norm.weight"

    def __init__(
        self, gguf: GGUFFile, kernels: KernelSet | str | None = None, exact_floats: bool | None = None
    ) -> None:
        self.kernels = resolve_kernel_set(kernels)
        # F16 / BF16 / F32 weights: the portable build's bits, or f32 sums (`resolve_exact_floats`)
        self.exact_floats = resolve_exact_floats(exact_floats)
        self._tile_cols = ops.tiles_for(self.kernels)  # the attention's many-lane tile width
        self.header = gguf.header
        self.config = self.make_config(gguf.header)
        self.rope_scaling = rope_scaling(gguf.metadata, gguf.header.architecture, self.config.n_ctx_train)
        self._gguf = gguf
        # rope_freqs / longrope factors, by tensor name; which one applies depends on n_ctx_seq
        self._rope_factors = {n: v for n in FREQ_FACTOR_TENSORS if (v := self.vec_or_none(n)) is not None}
        self.n_ctx_seq = self.config.n_ctx_train  # a sequence's context: the engine sets it (longrope)
        self.tok_embd_type = gguf.tensors["token_embd.weight"].ggml_type
        self._tok_embd_raw = gguf.tensor_bytes("token_embd.weight")
        self._tok_row_bytes = self._tok_embd_raw.nbytes // self.config.n_vocab
        # repacking the weights is numpy copies and gathers, which release the GIL: one thread per core
        with ThreadPoolExecutor(min(os.cpu_count() or 1, 8), thread_name_prefix="llama-load") as pool:
            output = pool.submit(lambda: self.matrix("output.weight") or self.matrix("token_embd.weight"))
            self.layers = list(pool.map(self.load_layer, range(self.config.n_layer)))
            tied = output.result()  # token_embd when there is no output matrix
        assert tied is not None
        self.output: ExactMatrix = tied
        self.output_norm = self.vec(self.output_norm_name)
        self._rope: dict[tuple[float, bool], np.ndarray] = {}  # by (base, sliding-window layer)
        self._scales = np.float32(self.q_scale()), np.float32(self.kq_scale())
        self._ws: Workspace | None = None
        # LoRA adapters applied to this forward pass, with their scales (set by the engine between steps)
        self.loras: list[tuple[LoraAdapter, float]] = []
        # asked between layers: True stops the pass there (StepInterrupted, resumable; the engine sets it
        # for a long prompt step that a newly arrived request should not wait behind)
        self.interrupt: Callable[[], bool] | None = None
        self._release_pages()

    # -- loading -----------------------------------------------------------------------------------------

    @classmethod
    def make_config(cls, h: ModelHeader) -> ModelConfig:
        n_head = _uniform(h.head_count, "head_count")
        n_head_kv = _uniform(h.head_count_kv, "head_count_kv")
        if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
            raise ValueError(f"head_count {n_head} must be a positive multiple of head_count_kv {n_head_kv}")
        return ModelConfig(
            arch=h.architecture,
            n_layer=h.block_count,
            n_embd=h.embedding_length,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=h.key_length,
            head_dim_v=h.value_length,
            n_vocab=h.vocab_size,
            n_ctx_train=h.context_length,
            rms_eps=h.layer_norm_rms_epsilon or 1e-5,
            rope_dims=h.rope_dimension_count or h.key_length,
            rope_base=h.rope_freq_base or 10000.0,
            rope_base_swa=h.rope_freq_base_swa or 10000.0,
            swa_window=None,
            swa_layers=frozenset(),
            attn_scale=1.0 / float(np.sqrt(h.key_length)),
            embed_scale=1.0,
        )

    def has(self, name: str) -> bool:
        return name in self._gguf.tensors

    def matrix(self, name: str) -> ExactMatrix | None:
        """A 2-D weight as a ExactMatrix (rows = ne1 outputs, cols = ne0 inputs), or None if absent."""
        t = self._gguf.tensors.get(name)
        if t is None:
            return None
        if len(t.shape) != 2:
            raise ValueError(f"tensor {name} has shape {list(t.shape)}, expected a matrix")
        m = self._exact(self._gguf.tensor_bytes(name), t.ggml_type, t.shape[1], t.shape[0])
        self._gguf.release(name)  # repacked: the file's pages need not stay resident while the rest loads
        return m

    def stacked(self, names: list[str]) -> ExactMatrix | None:
        """The matrices ``names`` stacked by rows into one (a single kernel launch for all of them, the same
        numbers: each output is its own row's product), when all exist with one row length and types that
        run one kernel (``ExactMatrix.stacked``)."""
        infos = [self._gguf.tensors.get(n) for n in names]
        if any(t is None or len(t.shape) != 2 for t in infos):
            return None
        cols = {t.shape[0] for t in infos if t is not None}
        if len(cols) != 1:
            return None
        parts = [
            (self._gguf.tensor_bytes(n), t.ggml_type, t.shape[1])
            for n, t in zip(names, infos, strict=True)
            if t is not None
        ]
        if _MATRIX_KERNELS:
            m = ExactMatrix.stacked(parts, cols.pop(), kernels=self.kernels, exact=self.exact_floats)
        else:
            m = ExactMatrix.stacked(parts, cols.pop())
        if m is not None:
            for n in names:
                self._gguf.release(n)
        return m

    def vec(self, name: str) -> np.ndarray:
        """A weight vector (norm weights, biases) as float32, copied out of the mmap."""
        v = self.vec_or_none(name)
        if v is None:
            raise ValueError(f"the model has no tensor {name}")
        return v

    def vec_or_none(self, name: str) -> np.ndarray | None:
        t = self._gguf.tensors.get(name)
        if t is None:
            return None
        raw = self._gguf.tensor_bytes(name)
        if t.ggml_type == GGMLQuantizationType.F32:
            return raw.view(np.float32).copy()
        return dequantize(raw, t.ggml_type, (t.n_elements,)).astype(np.float32)

    def load_layer(self, il: int) -> LayerWeights:
        p = f"blk.{il}."
        fused = self.matrix(p + "attn_qkv.weight")
        if fused is None:  # q, k, v in one launch where they share a type
            fused = self.stacked([p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"])
        wo = self.matrix(p + "attn_output.weight")
        if wo is None:
            raise ValueError(f"layer {il} lacks attn_output weights")
        return LayerWeights(
            attn_norm=self.vec(p + "attn_norm.weight"),
            wq=None if fused else self.matrix(p + "attn_q.weight"),
            wk=None if fused else self.matrix(p + "attn_k.weight"),
            wv=None if fused else self.matrix(p + "attn_v.weight"),
            wqkv=fused,
            wo=wo,
            ffn_norm=self.vec_or_none(p + "ffn_norm.weight"),
            ffn=self.load_ffn(il),
            bq=self.vec_or_none(p + "attn_q.bias"),
            bk=self.vec_or_none(p + "attn_k.bias"),
            bv=self.vec_or_none(p + "attn_v.bias"),
            bo=self.vec_or_none(p + "attn_output.bias"),
            q_norm=self.vec_or_none(p + "attn_q_norm.weight"),
            k_norm=self.vec_or_none(p + "attn_k_norm.weight"),
            post_attn_norm=self.vec_or_none(p + "post_attention_norm.weight"),
            post_ffn_norm=self.vec_or_none(p + "post_ffw_norm.weight"),
            sinks=self.vec_or_none(p + "attn_sinks.weight"),
        )

    def load_recurrent_layer(
        self, il: int, mixer: ShortConv | Mamba2 | DeltaNet, ffn_norm: str = "ffn_norm.weight"
    ) -> LayerWeights:
        """Layer ``il`` with the recurrent ``mixer`` in attention's place: its input norm, the FFN's input
        norm (the block's tensor ``ffn_norm``) and the FFN."""
        p = f"blk.{il}."
        return LayerWeights(
            attn_norm=self.vec(p + "attn_norm.weight"),
            wq=None,
            wk=None,
            wv=None,
            wqkv=None,
            wo=None,
            ffn_norm=self.vec(p + ffn_norm),
            ffn=self.load_ffn(il),
            mixer=mixer,
        )

    def load_ffn(self, il: int) -> FFN:
        """Layer ``il``'s FFN kind: the dense gated FFN here; an architecture with experts returns its
        ``MoE`` for the layers that have them."""
        return DenseFFN.load(self, il, self.activation)

    def expert_matrices(self, names: list[str], n_expert: int) -> ExpertMatrix | None:
        """The 3-D tensors ``names`` ([n_expert] x rows x cols in the file, read from the mmap) as one
        ExpertMatrix, several names stacked by rows per expert (one launch, as ``stacked``); None when a
        tensor is absent or the slices do not stack."""
        infos = [self._gguf.tensors.get(n) for n in names]
        if any(t is None for t in infos):
            return None
        shapes = {t.shape for t in infos if t is not None}
        for name, t in zip(names, infos, strict=True):
            assert t is not None
            if len(t.shape) != 3 or t.shape[2] != n_expert:
                raise ValueError(
                    f"tensor {name} has shape {list(t.shape)}, expected [cols, rows, {n_expert}]"
                )
        if len(shapes) != 1:
            return None
        cols, rows, _ = shapes.pop()
        parts = [
            (self._gguf.tensor_bytes(n), t.ggml_type, rows) for n, t in zip(names, infos, strict=True) if t
        ]
        m = ExpertMatrix.stacked(parts, n_expert, cols, kernels=self.kernels)
        for n in names:
            self._gguf.release(n)
        return m

    def row(self, name: str) -> ExactMatrix | None:
        """A 1-D weight as a one-row ExactMatrix (a product with it is one dot per token), or None."""
        t = self._gguf.tensors.get(name)
        if t is None:
            return None
        if len(t.shape) != 1:
            raise ValueError(f"tensor {name} has shape {list(t.shape)}, expected a vector")
        return self._exact(self._gguf.tensor_bytes(name), t.ggml_type, 1, t.shape[0])

    def _exact(self, raw: np.ndarray, qtype: GGMLQuantizationType, rows: int, cols: int) -> ExactMatrix:
        if _MATRIX_KERNELS:
            return ExactMatrix(raw, qtype, rows, cols, kernels=self.kernels, exact=self.exact_floats)
        return ExactMatrix(raw, qtype, rows, cols)

    def _release_pages(self) -> None:
        """Weights now live repacked in memory: drop the file pages we touched from resident memory."""
        self._gguf.release()

    # -- cache -------------------------------------------------------------------------------------------

    @property
    def recurrent_layers(self) -> list[int]:
        """The layers with a recurrent ``mixer`` in attention's place (llama.cpp's is_recr): none here."""
        return []

    def kv_layers(self) -> list[int]:
        """The layers that store keys and values in the KV cache: those that attend."""
        rec = self.recurrent_layers
        return [il for il in range(self.config.n_layer) if il not in rec]

    def recurrent_rows(self) -> tuple[int, int] | None:
        """The widths of one sequence's state in each recurrent layer, (conv r_dim, SSM s_dim) of the
        ``RecurrentPool`` beside the KV cache (llama.cpp's hybrid memory); None: no recurrent memory."""
        return None

    # How the recurrent state's values are laid out where they differ from ggml's, named in slot files'
    # fingerprints (a file of another layout is refused); None: ggml's.
    state_layout: str | None = None

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
        c = self.config
        self.workspace(n_ubatch)
        rows = self.recurrent_rows()
        state = RecurrentPool(n_seq_max, self.recurrent_layers, *rows) if rows is not None else None
        layers = self.kv_layers()
        return KVCache(
            n_ctx,
            c.n_layer,
            c.n_head_kv * c.head_dim,
            frozenset(il for il in layers if il in c.swa_layers),
            c.swa_window,
            n_seq_max=n_seq_max,
            n_ubatch=n_ubatch,
            swa_full=swa_full,
            type_k=type_k,
            type_v=type_v,
            flash_attn=flash_attn,
            head_dim=c.head_dim,
            layers=layers,
            recurrent=state,
        )

    def rope_cache(self, il: int, n_pos: int) -> np.ndarray:
        c = self.config
        swa = il in c.swa_layers
        base = c.rope_base_swa if swa else c.rope_base
        table = self._rope.get((base, swa))
        if table is None or len(table) < n_pos:
            scaling = self.rope_scaling
            if swa and not self.swa_rope_scaled:  # llama.cpp: their own freq_scale (1 unless set)
                scaling = dataclasses.replace(scaling, freq_scale=1.0)
            args = scaling.table_args(c.rope_dims, base)
            ff = freq_factors(self._rope_factors, self.n_ctx_seq, scaling.n_ctx_orig)
            table = ops.rope_cache(max(n_pos, 4096), c.rope_dims, base, **args, freq_factors=ff)
            self._rope[(base, swa)] = table
        return table

    def shift_k(self, il: int, k: np.ndarray, cells: np.ndarray, delta: int) -> None:
        """Rotate cached keys by `delta` positions (RoPE is a rotation, so this re-positions them)."""
        c = self.config
        rows = k[cells].astype(np.float32)  # an f16 cache rotates in float and stores back rounded (ggml)
        table = self.rope_cache(il, abs(delta) + 1)
        if delta < 0:
            table = table.copy()
            table[:, :, 1] *= -1  # rotation by -delta: sin flips sign
        pos = np.full(len(cells), abs(delta), np.int32)
        ops.rope(rows, pos, table, len(cells), c.n_head_kv, c.head_dim, c.rope_dims, self.rope_mode)
        k[cells] = rows

    # -- forward -----------------------------------------------------------------------------------------

    def workspace(self, n_batch: int) -> Workspace:
        """The model's buffers for batches of up to ``n_batch`` tokens (allocated once; a larger batch
        allocates them again for its size)."""
        ws = self._ws
        if ws is None or ws.n_batch < n_batch:
            c = self.config
            dense = [lw.ffn for lw in self.layers if isinstance(lw.ffn, DenseFFN)]
            moes = [lw.ffn for lw in self.layers if isinstance(lw.ffn, MoE)]
            if len({m.layout for m in moes}) > 1:
                raise ValueError("expert layers of different shapes in one model are not supported")
            ws = self._ws = Workspace(
                max(n_batch, 1),
                c.n_embd,
                c.n_head * c.head_dim,
                c.n_head_kv * c.head_dim,
                max((f.n_ff for f in dense), default=0),  # layers of several widths: sized for the widest
                c.n_vocab,
                split_qkv=any(layer.wqkv is None for layer in self.layers),
                split_gate_up=any(f.w_gate is not None for f in dense),
            )
            ws.moe = moes[0].buffers(ws.n_batch, c.n_embd) if moes else None
            if any(lw.mixer is not None for lw in self.layers):
                ws.mixer = self.mixer_buffers(ws.n_batch)
        return ws

    def mixer_buffers(self, n_batch: int) -> ShortConvBuffers | Mamba2Buffers | DeltaNetBuffers:
        """The recurrent layers' scratch for batches of up to ``n_batch`` tokens (the short convolution's
        here; an architecture with another mixer returns its own)."""
        return ShortConvBuffers(n_batch, self.config.n_embd)

    def embed(self, tokens: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Token embeddings [n, n_embd] (ggml_get_rows on token_embd), times the architecture's scale,
        written into ``out`` if given."""
        c = self.config
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= c.n_vocab):
            raise ValueError(f"token id out of range 0..{c.n_vocab - 1}")
        rows = self._tok_embd_raw.reshape(c.n_vocab, self._tok_row_bytes)[tokens]
        x = dequantize(rows, self.tok_embd_type, (len(tokens), c.n_embd)).astype(np.float32, copy=False)
        if out is None:
            out = np.empty((len(tokens), c.n_embd), np.float32)
        if c.embed_scale != 1.0:
            np.multiply(x, np.float32(c.embed_scale), out=out, casting="same_kind")
        else:
            np.copyto(out, x, casting="same_kind")
        return out

    def forward(
        self, batch: Batch, kv: KVCache, resume: Suspension | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run the batch; returns (logits [n_logits, n_vocab], final-normed hidden states [n_out, n_embd])
        for the tokens with `batch.output` set, in batch order (logits for the first `batch.n_logits`
        output rows only, when it is not -1). `resume`: go on with the same batch from where an interrupted
        pass stopped (other batches may have run in between, on other sequences).

        Both are views into the model's workspace, valid until the next forward: copy what must outlive
        it."""
        with _FORWARD_LOCK:
            n, c = batch.n, self.config
            ws = self.workspace(n)
            h = ws.h
            if resume is None:
                self.embed(batch.tokens, ws.x[:n])
                placed = kv.place(batch)
                ops.rms_norm(h.x, ws.x, self.layers[0].attn_norm, c.rms_eps, n, c.n_embd)
                first = 0
            else:
                placed, first = resume.placed, resume.layer
                self.restore(ws, n, resume)
            for il in range(first, c.n_layer):
                if il > first and self.interrupt is not None and self.interrupt():
                    raise StepInterrupted(self.suspend(ws, n, il, placed))
                self.block(il, ws, batch, kv, placed)
            m = ops.output_norm(h.x, ws.x, batch.output, self.output_norm, c.rms_eps, n, c.n_embd)
            if m == 0:
                return np.zeros((0, c.n_vocab), np.float32), np.zeros((0, c.n_embd), np.float32)
            m_logits = m if batch.n_logits < 0 else min(batch.n_logits, m)
            logits = ws.logits(m_logits)
            if m_logits:
                if self.collector is not None:
                    self.collector.observe(-1, "output", h.x[:m_logits])
                self.output.matmul(_fresh(h, m_logits), out=logits)
                self.finish_logits(logits)
            return logits, h.x[:m]

    def suspend(self, ws: Workspace, n: int, layer: int, placed: Placement) -> Suspension:
        """What a pass stopped before `layer` needs to go on later, copied out of the shared workspace
        (an architecture carrying more between layers adds it as `extra`)."""
        kept = Placement(list(placed.cells), list(placed.ranges), placed.n_pos)  # the cache refills its own
        return Suspension(layer, ws.x[:n].copy(), ws.h.x[:n].copy(), kept)

    def restore(self, ws: Workspace, n: int, s: Suspension) -> None:
        """The workspace as it was when the pass stopped (`suspend`)."""
        ws.x[:n] = s.x
        _fresh(ws.h, n).x[:n] = s.h

    def finish_logits(self, logits: np.ndarray) -> None:
        """Transform the logits in place (1: none)."""

    def block(self, il: int, ws: Workspace, batch: Batch, kv: KVCache, placed: Placement) -> None:
        """One layer on the normed input ``ws.h``: attention and FFN with their residual adds, leaving the
        next layer's normed input (the last layer: the residual stream alone) in the workspace."""
        n, c, lw = batch.n, self.config, self.layers[il]
        eps, d = c.rms_eps, c.n_embd
        if lw.mixer is not None:
            lw.mixer.forward(self, il, ws, batch, kv, placed)
        else:
            self.attention(il, ws, batch, kv, placed)
        assert lw.ffn_norm is not None
        post = _vec(lw.post_attn_norm)
        ops.residual_norm(ws.x, ws.o, _vec(lw.bo), post, lw.ffn_norm, ws.h.x, eps, n, d)
        self.ffn(il, ws, n)
        nxt = self.layers[il + 1].attn_norm if il + 1 < c.n_layer else EMPTY
        ops.residual_norm(ws.x, ws.o, EMPTY, _vec(lw.post_ffn_norm), nxt, ws.h.x, eps, n, d)

    def attention(self, il: int, ws: Workspace, batch: Batch, kv: KVCache, placed: Placement) -> None:
        """The attention block from ``ws.h`` to its output projection in ``ws.o`` (before the bias)."""
        lw, c = self.layers[il], self.config
        n = batch.n
        rows = ws.rows(n)
        h = _fresh(ws.h, n)
        if self.collector is not None:
            self.collector.observe(il, "qkv", h.x[:n])
        if lw.wqkv is not None:
            lw.wqkv.matmul(h, out=rows.qkv)
        else:  # one input for three matrices, quantized once, then laid out as the fused product is
            assert lw.wq is not None and lw.wk is not None and lw.wv is not None
            assert rows.q is not None and rows.k is not None and rows.v is not None
            nq, nk = lw.wq.rows, lw.wk.rows
            lw.wq.matmul(h, out=rows.q)
            lw.wk.matmul(h, out=rows.k)
            lw.wv.matmul(h, out=rows.v)
            rows.qkv[:, :nq], rows.qkv[:, nq : nq + nk], rows.qkv[:, nq + nk :] = rows.q, rows.k, rows.v
        if self.loras:
            self._lora_qkv(il, h.x[:n], rows.qkv)
        pi = kv.pool_index(il)
        pool, ranges = kv.cell_pool(il), placed.ranges[pi]
        kc, vc = pool.kernel_kv[il]
        attend: Any = ops.attend
        typed: tuple[Any, ...] = ()
        if pool.typed_attention:  # flash attention, or a bf16 / block-type cache (ops.flash_attn)
            attend, typed = ops.attend_typed, (*pool.attention_kinds, pool.store(il))
        table, rot = self.rope_cache(il, placed.n_pos), self.rope_dims(il)
        prep = _vec(lw.bq), _vec(lw.bk), _vec(lw.bv), _vec(lw.q_norm), _vec(lw.k_norm)
        temp = self.q_temperature(batch.pos, n)
        if temp is not None:  # q times a per-token factor after RoPE: the steps before it run here, not again
            eps = np.float32(c.rms_eps)
            geo = c.n_head, c.n_head_kv, c.head_dim, rot, self.rope_mode
            prepare_qkv(ws.qkv, *prep, eps, batch.pos, table, n, *geo)
            q = rows.qkv[:, : c.n_head * c.head_dim]
            np.multiply(q, temp[:, None], out=q)
            prep, rot = (EMPTY, EMPTY, EMPTY, EMPTY, EMPTY), 0
        attend(
            ws.attn.x,
            ws.qkv,
            ws.q,
            *prep,
            np.float32(c.rms_eps),
            batch.pos,
            table,
            kc,
            vc,
            placed.cells[pi],
            ranges.cells,
            ranges.lo,
            ranges.hi,
            n,
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            rot,
            self.rope_mode,
            *self._scales,
            self._tile_cols,
            _vec(lw.sinks),
            *typed,
        )
        if self.collector is not None:
            self.collector.observe(il, "attn_output", ws.attn.x[:n])
        assert lw.wo is not None
        lw.wo.matmul(_fresh(ws.attn, n), out=rows.o)
        if self.loras:
            self.add_lora(il, "attn_output", ws.attn.x[:n], rows.o)

    def rope_dims(self, il: int) -> int:
        """The dimensions of each head that layer ``il`` rotates (0: a NoPE layer, no position encoding)."""
        return self.config.rope_dims

    def q_temperature(self, pos: np.ndarray, n: int) -> np.ndarray | None:
        """Per-token factors [n] (float32) on q after RoPE, from the tokens' positions ``pos`` (llama.cpp's
        attention temperature scaling); None: none."""
        return None

    def q_scale(self) -> float:
        """A factor on q after RoPE (1: none)."""
        return 1.0

    def kq_scale(self) -> float:
        return self.config.attn_scale

    def ffn(self, il: int, ws: Workspace, n: int) -> None:
        """Layer ``il``'s FFN from ``ws.h`` to ``ws.o`` (before the post-norm)."""
        self.layers[il].ffn.forward(self, il, ws, n)

    # -- LoRA --------------------------------------------------------------------------------------------

    def add_lora(self, il: int, kind: str, x: np.ndarray, out: np.ndarray) -> None:
        """out += each active adapter's delta for layer il's `kind` weight, on its input x (build_lora_mm)."""
        for adapter, scale in self.loras:
            w = adapter.weights.get((il, kind))
            if w is not None:
                w.add_to(out, x, w.scale(adapter.alpha, scale))

    def _lora_qkv(self, il: int, x: np.ndarray, qkv: np.ndarray) -> None:
        c = self.config
        nq, nk = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        self.add_lora(il, "attn_qkv", x, qkv)
        self.add_lora(il, "attn_q", x, qkv[:, :nq])
        self.add_lora(il, "attn_k", x, qkv[:, nq : nq + nk])
        self.add_lora(il, "attn_v", x, qkv[:, nq + nk :])


def _fresh(acts: Activations, n: int) -> Activations:
    """``acts`` after its f32 rows were written: ``n`` rows, earlier conversions forgotten."""
    acts.rows(n)
    return acts


def _vec(v: np.ndarray | None) -> np.ndarray:
    """A vector the kernels take: an absent one as the empty vector they skip."""
    return EMPTY if v is None else v


def _uniform(v: int | tuple[int, ...], what: str) -> int:
    if isinstance(v, tuple):
        if len(set(v)) != 1:
            raise ValueError(f"per-layer {what} values {v} are not supported")
        return v[0]
    return v
