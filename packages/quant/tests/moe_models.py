"""Tiny random-weight GGUFs of the MoE, hybrid and recurrent architectures, as llama.cpp's converter names them.

Each layout lists the real tensor names and shapes (ggml order: row length first; experts stacked in the
third dimension) and the metadata keys llama.cpp's ``load_hparams`` needs for the architecture, so that
``llama-quantize`` opens the file. Sizes are as small as still exercises the type rules: ``block_count`` 8
(``n_layer / 8`` is 1), rows of 256 (k-quant blocks) or of a multiple of 32 only (fallback types).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import gguf_io
from gguf_io import GGMLQuantizationType as T
from gguf_io import GGUFValueType
from llama_quant import quantize

U32 = GGUFValueType.UINT32
F32 = GGUFValueType.FLOAT32
N_LAYER = 8


@dataclass
class Layout:
    """An architecture's metadata keys (without the ``{arch}.`` prefix) and tensors, in file order."""

    arch: str
    keys: dict[str, tuple[Any, GGUFValueType]] = field(default_factory=dict)
    tensors: list[tuple[str, tuple[int, ...], T]] = field(default_factory=list)
    matrix_type: T = T.F16

    def key(self, key: str, value: Any, vtype: GGUFValueType = U32) -> None:
        self.keys[key] = (value, vtype)

    def add(self, name: str, *shape: int, qtype: T | None = None) -> None:
        """A tensor of ggml shape ``shape``: F32 when 1-D, else ``qtype`` or the layout's matrix type."""
        if qtype is None:  # not `or`: T.F32 is 0
            qtype = T.F32 if len(shape) == 1 else self.matrix_type
        self.tensors.append((name, shape, qtype))

    def experts(self, i: int, n_embd: int, n_ff: int, n_expert: int, qtype: T | None = None) -> None:
        self.add(f"blk.{i}.ffn_gate_inp.weight", n_embd, n_expert, qtype=T.F32)
        self.add(f"blk.{i}.ffn_gate_exps.weight", n_embd, n_ff, n_expert, qtype=qtype)
        self.add(f"blk.{i}.ffn_up_exps.weight", n_embd, n_ff, n_expert, qtype=qtype)
        self.add(f"blk.{i}.ffn_down_exps.weight", n_ff, n_embd, n_expert, qtype=qtype)

    def shared_expert(self, i: int, n_embd: int, n_ff: int) -> None:
        self.add(f"blk.{i}.ffn_gate_shexp.weight", n_embd, n_ff)
        self.add(f"blk.{i}.ffn_up_shexp.weight", n_embd, n_ff)
        self.add(f"blk.{i}.ffn_down_shexp.weight", n_ff, n_embd)

    def attention(self, i: int, n_embd: int, n_q: int, n_kv: int, n_out: int, bias: bool = False) -> None:
        self.add(f"blk.{i}.attn_q.weight", n_embd, n_q)
        self.add(f"blk.{i}.attn_k.weight", n_embd, n_kv)
        self.add(f"blk.{i}.attn_v.weight", n_embd, n_kv)
        self.add(f"blk.{i}.attn_output.weight", n_out, n_embd)
        if bias:
            for part, n in (("q", n_q), ("k", n_kv), ("v", n_kv), ("output", n_embd)):
                self.add(f"blk.{i}.attn_{part}.bias", n)

    def metadata(self) -> dict[str, Any]:
        """The metadata as ``GGUFFile.metadata`` reads it back."""
        md = {f"{self.arch}.{k}": v for k, (v, _) in self.keys.items()}
        return {"general.architecture": self.arch, **md}


def _common(lay: Layout, n_embd: int, n_head: int, n_head_kv: int | list[int], rms_eps: float) -> None:
    lay.key("context_length", 4096)
    lay.key("embedding_length", n_embd)
    lay.key("block_count", N_LAYER)
    lay.key("attention.head_count", n_head)
    lay.key("attention.head_count_kv", n_head_kv)
    lay.key("attention.layer_norm_rms_epsilon", rms_eps, F32)


def qwen3moe(n_expert: int = 8) -> Layout:
    """Qwen3-30B-A3B: GQA attention with q/k norms, routed experts only, tied embeddings."""
    n_embd, head, n_head, n_head_kv, n_ff, vocab = 256, 64, 4, 1, 256, 256
    lay = Layout("qwen3moe")
    _common(lay, n_embd, n_head, n_head_kv, 1e-6)
    lay.key("attention.key_length", head)
    lay.key("attention.value_length", head)
    lay.key("expert_count", n_expert)
    lay.key("expert_used_count", 2)
    lay.key("expert_feed_forward_length", n_ff)
    lay.add("token_embd.weight", n_embd, vocab)
    lay.add("output_norm.weight", n_embd)
    for i in range(N_LAYER):
        lay.add(f"blk.{i}.attn_norm.weight", n_embd)
        lay.attention(i, n_embd, head * n_head, head * n_head_kv, head * n_head)
        lay.add(f"blk.{i}.attn_q_norm.weight", head)
        lay.add(f"blk.{i}.attn_k_norm.weight", head)
        lay.add(f"blk.{i}.ffn_norm.weight", n_embd)
        lay.experts(i, n_embd, n_ff, n_expert)
    return lay


def gpt_oss(expert_type: T = T.MXFP4) -> Layout:
    """gpt-oss as its converter writes it: BF16 matrices, MXFP4 experts, attention sinks, biases everywhere
    (2-D expert biases too), rows of 320 (like 2880: a multiple of 32, not of 256)."""
    n_embd, head, n_head, n_head_kv, n_ff, n_expert, vocab = 320, 64, 8, 2, 320, 4, 320
    lay = Layout("gpt-oss", matrix_type=T.BF16)
    _common(lay, n_embd, n_head, n_head_kv, 1e-5)
    lay.key("attention.key_length", head)
    lay.key("attention.value_length", head)
    lay.key("attention.sliding_window", 128)
    lay.key("expert_count", n_expert)
    lay.key("expert_used_count", 2)
    lay.key("expert_feed_forward_length", n_ff)
    lay.add("token_embd.weight", n_embd, vocab)
    lay.add("output_norm.weight", n_embd)
    lay.add("output.weight", n_embd, vocab)
    for i in range(N_LAYER):
        lay.add(f"blk.{i}.attn_norm.weight", n_embd)
        lay.add(f"blk.{i}.post_attention_norm.weight", n_embd)
        lay.attention(i, n_embd, head * n_head, head * n_head_kv, head * n_head, bias=True)
        lay.add(f"blk.{i}.attn_sinks.weight", n_head)
        lay.experts(i, n_embd, n_ff, n_expert, qtype=expert_type)
        lay.add(f"blk.{i}.ffn_gate_inp.bias", n_expert)
        lay.add(f"blk.{i}.ffn_gate_exps.bias", n_ff, n_expert, qtype=T.F32)
        lay.add(f"blk.{i}.ffn_up_exps.bias", n_ff, n_expert, qtype=T.F32)
        lay.add(f"blk.{i}.ffn_down_exps.bias", n_embd, n_expert, qtype=T.F32)
    return lay


def qwen35moe() -> Layout:
    """Qwen3.5-MoE: gated delta-net layers (fused ``attn_qkv``, ``attn_gate``, ``ssm_*``) with full attention
    every 4th layer, routed experts with 64-long down rows (fallback types) and a shared expert per layer."""
    n_embd, head, n_head, n_head_kv, n_ff, n_ff_sh, n_expert, vocab = 256, 64, 4, 2, 64, 256, 12, 256
    d_state, n_group, dt_rank, d_conv = 64, 2, 4, 4
    key_dim, value_dim = d_state * n_group, d_state * dt_rank
    lay = Layout("qwen35moe")
    _common(lay, n_embd, n_head, n_head_kv, 1e-6)
    lay.key("attention.key_length", head)
    lay.key("attention.value_length", head)
    lay.key("rope.dimension_count", 32)
    lay.key("rope.dimension_sections", [11, 11, 10, 0], GGUFValueType.INT32)
    lay.key("expert_count", n_expert)
    lay.key("expert_used_count", 2)
    lay.key("expert_feed_forward_length", n_ff)
    lay.key("expert_shared_feed_forward_length", n_ff_sh)
    lay.key("full_attention_interval", 4)
    for k, v in (("conv_kernel", d_conv), ("inner_size", value_dim), ("state_size", d_state)):
        lay.key(f"ssm.{k}", v)
    lay.key("ssm.time_step_rank", dt_rank)
    lay.key("ssm.group_count", n_group)
    lay.add("token_embd.weight", n_embd, vocab)
    lay.add("output_norm.weight", n_embd)
    lay.add("output.weight", n_embd, vocab)
    for i in range(N_LAYER):
        lay.add(f"blk.{i}.attn_norm.weight", n_embd)
        lay.add(f"blk.{i}.post_attention_norm.weight", n_embd)
        if (i + 1) % 4 == 0:
            lay.attention(i, n_embd, head * n_head * 2, head * n_head_kv, head * n_head)
            lay.add(f"blk.{i}.attn_q_norm.weight", head)
            lay.add(f"blk.{i}.attn_k_norm.weight", head)
        else:
            lay.add(f"blk.{i}.attn_qkv.weight", n_embd, key_dim * 2 + value_dim)
            lay.add(f"blk.{i}.attn_gate.weight", n_embd, value_dim)
            lay.add(f"blk.{i}.ssm_conv1d.weight", d_conv, key_dim * 2 + value_dim)
            lay.add(f"blk.{i}.ssm_dt.bias", dt_rank)
            lay.add(f"blk.{i}.ssm_a", dt_rank)
            lay.add(f"blk.{i}.ssm_beta.weight", n_embd, dt_rank)
            lay.add(f"blk.{i}.ssm_alpha.weight", n_embd, dt_rank)
            lay.add(f"blk.{i}.ssm_norm.weight", d_state)
            lay.add(f"blk.{i}.ssm_out.weight", value_dim, n_embd)
        lay.experts(i, n_embd, n_ff, n_expert)
        lay.add(f"blk.{i}.ffn_gate_inp_shexp.weight", n_embd)
        lay.shared_expert(i, n_embd, n_ff_sh)
    return lay


def granitehybrid() -> Layout:
    """Granite-4.0-H: Mamba-2 layers (``ssm_in``, ``ssm_conv1d``, ``ssm_a``/``ssm_d`` without a ``.weight``
    suffix, ``ssm_norm``) with attention in two layers (``head_count_kv`` 0 marks the others, so layer 0's
    GQA is 0), routed and shared experts in every layer, tied embeddings."""
    n_embd, head, n_head, n_ff, n_ff_sh, n_expert, vocab = 256, 64, 4, 256, 256, 4, 256
    d_conv, d_inner, d_state, n_ssm_head = 4, 2 * n_embd, 64, 8
    d_in_proj, d_xbc = 2 * d_inner + 2 * d_state + n_ssm_head, d_inner + 2 * d_state
    attn_layers = {N_LAYER // 2 - 1, N_LAYER - 1}
    lay = Layout("granitehybrid")
    _common(lay, n_embd, n_head, [1 if i in attn_layers else 0 for i in range(N_LAYER)], 1e-5)
    lay.key("feed_forward_length", n_ff)
    lay.key("expert_count", n_expert)
    lay.key("expert_used_count", 2)
    lay.key("expert_shared_feed_forward_length", n_ff_sh)
    for k, v in (("conv_kernel", d_conv), ("inner_size", d_inner), ("state_size", d_state)):
        lay.key(f"ssm.{k}", v)
    lay.key("ssm.time_step_rank", n_ssm_head)
    lay.key("ssm.group_count", 1)
    lay.add("token_embd.weight", n_embd, vocab)
    lay.add("output_norm.weight", n_embd)
    for i in range(N_LAYER):
        lay.add(f"blk.{i}.attn_norm.weight", n_embd)
        if i in attn_layers:
            lay.attention(i, n_embd, head * n_head, head, head * n_head)
        else:
            lay.add(f"blk.{i}.ssm_in.weight", n_embd, d_in_proj)
            lay.add(f"blk.{i}.ssm_conv1d.weight", d_conv, d_xbc)
            lay.add(f"blk.{i}.ssm_conv1d.bias", d_xbc)
            lay.add(f"blk.{i}.ssm_dt.bias", n_ssm_head)
            lay.add(f"blk.{i}.ssm_a", 1, n_ssm_head, qtype=T.F32)
            lay.add(f"blk.{i}.ssm_d", 1, n_ssm_head, qtype=T.F32)
            lay.add(f"blk.{i}.ssm_norm.weight", d_inner, 1, qtype=T.F32)
            lay.add(f"blk.{i}.ssm_out.weight", d_inner, n_embd)
        lay.add(f"blk.{i}.ffn_norm.weight", n_embd)
        lay.experts(i, n_embd, n_ff, n_expert)
        lay.shared_expert(i, n_embd, n_ff_sh)
    return lay


def lfm2() -> Layout:
    """LFM2: short-convolution layers (``shortconv.conv`` stays F32) with attention in three layers, dense
    FFNs, ``token_embd_norm`` as the output norm, tied embeddings."""
    n_embd, head, n_head, n_head_kv, n_ff, vocab = 256, 64, 4, 2, 512, 256
    attn_layers = {2, 5, 7}
    lay = Layout("lfm2")
    _common(lay, n_embd, n_head, [n_head_kv if i in attn_layers else 0 for i in range(N_LAYER)], 1e-5)
    lay.key("feed_forward_length", n_ff)
    lay.key("shortconv.l_cache", 3)
    lay.add("token_embd.weight", n_embd, vocab)
    lay.add("token_embd_norm.weight", n_embd)
    for i in range(N_LAYER):
        lay.add(f"blk.{i}.attn_norm.weight", n_embd)
        if i in attn_layers:
            lay.attention(i, n_embd, n_embd, head * n_head_kv, n_embd)
            lay.add(f"blk.{i}.attn_q_norm.weight", head)
            lay.add(f"blk.{i}.attn_k_norm.weight", head)
        else:
            lay.add(f"blk.{i}.shortconv.conv.weight", 3, n_embd)
            lay.add(f"blk.{i}.shortconv.in_proj.weight", n_embd, 3 * n_embd)
            lay.add(f"blk.{i}.shortconv.out_proj.weight", n_embd, n_embd)
        lay.add(f"blk.{i}.ffn_norm.weight", n_embd)
        lay.add(f"blk.{i}.ffn_gate.weight", n_embd, n_ff)
        lay.add(f"blk.{i}.ffn_up.weight", n_embd, n_ff)
        lay.add(f"blk.{i}.ffn_down.weight", n_ff, n_embd)
    return lay


LAYOUTS: dict[str, Callable[[], Layout]] = {
    "qwen3moe": qwen3moe,
    "gpt-oss": gpt_oss,
    "gpt-oss-f16-experts": lambda: gpt_oss(expert_type=T.F16),
    "qwen35moe": qwen35moe,
    "granitehybrid": granitehybrid,
    "lfm2": lfm2,
}


def write(path: Path, lay: Layout, seed: int = 0) -> Path:
    """The layout as a GGUF with seeded random weights (``general.file_type`` 1, as a converter writes)."""
    rng = np.random.default_rng(seed)
    w = gguf_io.GGUFWriter(path)
    w.add_metadata("general.architecture", lay.arch)
    w.add_metadata("general.name", f"tiny-{lay.arch}")
    w.add_metadata("general.file_type", 1, U32)
    for key, (value, vtype) in lay.keys.items():
        if isinstance(value, list):
            w.add_metadata(f"{lay.arch}.{key}", value, GGUFValueType.ARRAY, vtype)
        else:
            w.add_metadata(f"{lay.arch}.{key}", value, vtype)
    for name, shape, qtype in lay.tensors:
        x = (rng.standard_normal(shape[::-1]) * 0.5).astype(np.float32)
        if qtype == T.F32:
            data = x
        elif qtype == T.F16:
            data = x.astype(np.float16)
        elif qtype == T.BF16:
            data = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncated: any bf16 value will do
        else:
            data = quantize(x.reshape(-1, shape[0]), qtype)
        w.add_tensor(name, shape, qtype, data)
    w.finish()
    return path
