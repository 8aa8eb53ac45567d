"""Tiny random-weight qwen35 / qwen35moe models (gated delta-net and gated attention layers), written with
gguf-io's writer in the tensor layout llama.cpp's converter produces.

Four layers, attention at 1 and 3 (``full_attention_interval`` 2); the delta-net has two key heads and
four value heads of 16, four conv taps. Partial M-RoPE over 8 of the 16 head dimensions, sections
[1, 1, 1, 1]: the fourth pair takes the text token's fourth position (0), so it stays unrotated.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tiny_models import (
    HEAD_DIM,
    N_EMBD,
    N_EXPERT,
    N_EXPERT_USED,
    N_FF,
    N_FF_EXP,
    N_HEAD,
    N_HEAD_KV,
    N_VOCAB,
    _byte_tokens,
)

import llama_quant
from gguf_io import GGMLQuantizationType, GGUFValueType, GGUFWriter

QWEN35_LAYERS = 4
QWEN35_ATTN_INTERVAL = 2  # layers 1 and 3 attend
QWEN35_ATTN_LAYERS = tuple(il for il in range(QWEN35_LAYERS) if (il + 1) % QWEN35_ATTN_INTERVAL == 0)
SSM_STATE = 16  # head_k_dim = head_v_dim
SSM_GROUPS = 2  # key heads
SSM_V_HEADS = 4  # value heads (time_step_rank)
SSM_TAPS = 4


def write_tiny_qwen35(path: Path, arch: str = "qwen35", seed: int = 0) -> Path:
    """A tiny random ``arch`` model (qwen35, or qwen35moe: every FFN N_EXPERT experts, N_EXPERT_USED
    chosen, and a gated shared expert)."""
    moe = arch == "qwen35moe"
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path)
    a = arch + "."
    u32 = GGUFValueType.UINT32
    w.add_metadata("general.architecture", arch)
    w.add_metadata("general.name", f"tiny-{arch}")
    for key, value in {
        "block_count": QWEN35_LAYERS,
        "context_length": 256,
        "embedding_length": N_EMBD,
        "feed_forward_length": N_FF,
        "attention.head_count": N_HEAD,
        "attention.head_count_kv": N_HEAD_KV,
        "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM,
        "rope.dimension_count": HEAD_DIM // 2,
        "vocab_size": N_VOCAB,
        "full_attention_interval": QWEN35_ATTN_INTERVAL,
        "ssm.conv_kernel": SSM_TAPS,
        "ssm.state_size": SSM_STATE,
        "ssm.group_count": SSM_GROUPS,
        "ssm.time_step_rank": SSM_V_HEADS,
        "ssm.inner_size": SSM_V_HEADS * SSM_STATE,
    }.items():
        w.add_metadata(a + key, value, u32)
    w.add_metadata(a + "rope.dimension_sections", np.array([1, 1, 1, 1], np.int32))
    w.add_metadata(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_metadata(a + "rope.freq_base", 10000000.0)
    if moe:
        w.add_metadata(a + "expert_count", N_EXPERT, u32)
        w.add_metadata(a + "expert_used_count", N_EXPERT_USED, u32)
        w.add_metadata(a + "expert_feed_forward_length", N_FF_EXP, u32)
        w.add_metadata(a + "expert_shared_feed_forward_length", N_FF_EXP, u32)
    w.add_metadata("tokenizer.ggml.model", "gpt2")
    w.add_metadata("tokenizer.ggml.pre", "default")
    w.add_metadata("tokenizer.ggml.tokens", [*_byte_tokens(), "<s>", "</s>", "<pad>"])
    w.add_metadata("tokenizer.ggml.token_type", np.array([1] * 256 + [3, 3, 3], np.int32))
    w.add_metadata("tokenizer.ggml.merges", [], GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_metadata("tokenizer.ggml.bos_token_id", 256, u32)
    w.add_metadata("tokenizer.ggml.eos_token_id", 257, u32)

    q8, f32 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.F32

    def mat(name: str, rows: int, cols: int, scale: float = 0.3, n_expert: int = 0) -> None:
        shape = [cols, rows, n_expert] if n_expert else [cols, rows]
        x = (rng.standard_normal((max(n_expert, 1) * rows, cols)) * scale).astype(np.float32)
        w.add_tensor(name, shape, q8, llama_quant.quantize(x, q8))

    def vec(name: str, n: int, around: float = 1.0, spread: float = 0.1) -> None:
        w.add_tensor(name, [n], f32, (around + spread * rng.standard_normal(n)).astype(np.float32))

    mat("token_embd.weight", N_VOCAB, N_EMBD, 1.0)
    vec("output_norm.weight", N_EMBD)
    mat("output.weight", N_VOCAB, N_EMBD)
    key_dim, value_dim = SSM_GROUPS * SSM_STATE, SSM_V_HEADS * SSM_STATE
    conv_dim = 2 * key_dim + value_dim
    for il in range(QWEN35_LAYERS):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", N_EMBD)
        vec(p + "post_attention_norm.weight", N_EMBD)
        if il in QWEN35_ATTN_LAYERS:
            mat(p + "attn_q.weight", 2 * N_HEAD * HEAD_DIM, N_EMBD)  # query and gate per head
            mat(p + "attn_k.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
            mat(p + "attn_v.weight", N_HEAD_KV * HEAD_DIM, N_EMBD)
            mat(p + "attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM)
            vec(p + "attn_q_norm.weight", HEAD_DIM)
            vec(p + "attn_k_norm.weight", HEAD_DIM)
        else:
            mat(p + "attn_qkv.weight", conv_dim, N_EMBD)
            mat(p + "attn_gate.weight", value_dim, N_EMBD)
            mat(p + "ssm_beta.weight", SSM_V_HEADS, N_EMBD)
            mat(p + "ssm_alpha.weight", SSM_V_HEADS, N_EMBD)
            taps = (0.5 * rng.standard_normal((conv_dim, SSM_TAPS))).astype(np.float32)
            w.add_tensor(p + "ssm_conv1d.weight", [SSM_TAPS, conv_dim], f32, taps)
            vec(p + "ssm_dt.bias", SSM_V_HEADS, 0.5, 0.5)
            vec(p + "ssm_a", SSM_V_HEADS, -0.5, 0.3)  # -exp(A_log)
            vec(p + "ssm_norm.weight", SSM_STATE)
            mat(p + "ssm_out.weight", N_EMBD, value_dim)
        if moe:
            mat(p + "ffn_gate_inp.weight", N_EXPERT, N_EMBD, 1.0)
            mat(p + "ffn_gate_exps.weight", N_FF_EXP, N_EMBD, n_expert=N_EXPERT)
            mat(p + "ffn_up_exps.weight", N_FF_EXP, N_EMBD, n_expert=N_EXPERT)
            mat(p + "ffn_down_exps.weight", N_EMBD, N_FF_EXP, n_expert=N_EXPERT)
            vec(p + "ffn_gate_inp_shexp.weight", N_EMBD, 0.0, 0.3)
            mat(p + "ffn_gate_shexp.weight", N_FF_EXP, N_EMBD)
            mat(p + "ffn_up_shexp.weight", N_FF_EXP, N_EMBD)
            mat(p + "ffn_down_shexp.weight", N_EMBD, N_FF_EXP)
        else:
            mat(p + "ffn_gate.weight", N_FF, N_EMBD)
            mat(p + "ffn_up.weight", N_FF, N_EMBD)
            mat(p + "ffn_down.weight", N_EMBD, N_FF)
    w.finish()
    return path
