"""Tiny random-weight models of every architecture, written with gguf-io's writer.

No real weights of qwen2, qwen3 or phi3 are available offline, so these prove the architecture code on
the tensor layout llama.cpp's converters produce. The tokenizer is a byte-level BPE over 256 byte tokens
plus three specials, enough for the engine to load the file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

import llama_quant
from gguf_io import GGMLQuantizationType, GGUFValueType, GGUFWriter

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 16
N_FF = 96
N_LAYER = 7  # gemma3's swa pattern puts a global layer at 5: seven layers cover both kinds
N_VOCAB = 259
# qwen3moe: experts per layer, chosen per token, each expert's FFN width (a multiple of 32: Q4_0 down rows)
N_EXPERT = 8
N_EXPERT_USED = 2
N_FF_EXP = 32
GPT_OSS_EXPERT_USED = 4  # gpt-oss chooses 4 (of 32 in the real model)
GPT_OSS_HEAD_DIM = 64  # the real model's (its q is wider than n_embd, as here)
GPT_OSS_WINDOW = 4  # gpt-oss.attention.sliding_window (128 in the real model)
# lfm2: the attention layers (the others are short convolutions) and the convolution's taps
LFM2_ATTN_LAYERS = (2, 5)
LFM2_L_CACHE = 3
# granitehybrid: the attention layers (the others Mamba-2), the SSM's shape (d_inner = 2 * n_embd, as
# llama.cpp requires) and Granite's multipliers
GRANITE_ATTN_LAYERS = (1, 4)
GRANITE_SSM = {
    "conv_kernel": 4,
    "inner_size": 2 * N_EMBD,
    "state_size": 16,
    "time_step_rank": 8,
    "group_count": 2,
}
GRANITE_SCALES = {
    "embedding_scale": 12.0,
    "residual_scale": 0.22,
    "attention.scale": 0.15,
    "logit_scale": 8.0,
}
N_FF_SHEXP = 32


def _byte_tokens() -> list[str]:
    # GPT-2's byte-to-unicode map, so every byte is one token.
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


def write_tiny_model(
    path: Path,
    arch: str,
    seed: int = 0,
    qtype: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
    extra: Callable[[GGUFWriter, np.random.Generator], None] | None = None,
    expert_qtype: GGMLQuantizationType | None = None,
    moe: bool | None = None,
) -> Path:
    """A tiny random model of `arch`; `extra(writer, rng)` adds metadata or tensors before it is written.
    With `moe` (default: for qwen3moe) every layer's FFN is N_EXPERT experts, N_EXPERT_USED chosen, their
    tensors in `expert_qtype` (default `qtype`), the router in F32 (as llama-quantize leaves it)."""
    if arch in ("qwen35", "qwen35moe"):  # delta-net and gated attention layers: their own layout
        from tiny_qwen35 import write_tiny_qwen35

        return write_tiny_qwen35(path, arch, seed)
    if arch == "gemma4":  # per-layer inputs and shared keys and values: its own layout
        from tiny_gemma4 import write_tiny_gemma4

        return write_tiny_gemma4(path, seed)
    oss = arch == "gpt-oss"
    moe = arch in ("qwen3moe", "gpt-oss") if moe is None else moe
    if oss and expert_qtype is None:
        expert_qtype = GGMLQuantizationType.MXFP4  # as the released files store the experts
    head_dim = GPT_OSS_HEAD_DIM if oss else HEAD_DIM
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path)
    a = arch + "."
    w.add_metadata("general.architecture", arch)
    w.add_metadata("general.name", f"tiny-{arch}")
    for key, value in {
        "block_count": N_LAYER,
        "context_length": 256,
        "embedding_length": N_EMBD,
        "feed_forward_length": N_FF,
        "attention.head_count": N_HEAD,
        "attention.head_count_kv": N_HEAD_KV,
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "vocab_size": N_VOCAB,
    }.items():
        if arch in ("lfm2", "granitehybrid") and key == "attention.head_count_kv":  # 0: a recurrent layer
            kv = [value if il not in _conv_layers(arch) else 0 for il in range(N_LAYER)]
            w.add_metadata(a + key, np.array(kv, np.int32))
            continue
        w.add_metadata(a + key, value, GGUFValueType.UINT32)
    if arch == "lfm2":
        w.add_metadata(a + "shortconv.l_cache", LFM2_L_CACHE, GGUFValueType.UINT32)
    if arch == "granitehybrid":
        for key, value in GRANITE_SSM.items():
            w.add_metadata(a + "ssm." + key, value, GGUFValueType.UINT32)
        for key, value in GRANITE_SCALES.items():
            w.add_metadata(a + key, value, GGUFValueType.FLOAT32)
        if moe:
            w.add_metadata(a + "expert_shared_feed_forward_length", N_FF_SHEXP, GGUFValueType.UINT32)
    w.add_metadata(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_metadata(a + "rope.freq_base", 150000.0 if oss else 10000.0)
    if arch == "gemma3":
        w.add_metadata(a + "attention.sliding_window", 4, GGUFValueType.UINT32)
    if oss:  # the released files' keys: YaRN x32 from 4,096 tokens
        w.add_metadata(a + "attention.sliding_window", GPT_OSS_WINDOW, GGUFValueType.UINT32)
        w.add_metadata(a + "rope.scaling.type", "yarn")
        w.add_metadata(a + "rope.scaling.factor", 32.0)
        w.add_metadata(a + "rope.scaling.original_context_length", 4096, GGUFValueType.UINT32)
    if moe:
        n_used = GPT_OSS_EXPERT_USED if oss else N_EXPERT_USED
        w.add_metadata(a + "expert_count", N_EXPERT, GGUFValueType.UINT32)
        w.add_metadata(a + "expert_used_count", n_used, GGUFValueType.UINT32)
        w.add_metadata(a + "expert_feed_forward_length", N_FF_EXP, GGUFValueType.UINT32)
    w.add_metadata("tokenizer.ggml.model", "gpt2")
    w.add_metadata("tokenizer.ggml.pre", "default")
    tokens = [*_byte_tokens(), "<s>", "</s>", "<pad>"]
    w.add_metadata("tokenizer.ggml.tokens", tokens)
    w.add_metadata("tokenizer.ggml.token_type", np.array([1] * 256 + [3, 3, 3], np.int32))
    w.add_metadata("tokenizer.ggml.merges", [], GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_metadata("tokenizer.ggml.bos_token_id", 256, GGUFValueType.UINT32)
    w.add_metadata("tokenizer.ggml.eos_token_id", 257, GGUFValueType.UINT32)

    def mat(
        name: str,
        rows: int,
        cols: int,
        scale: float = 0.3,
        n_expert: int = 0,
        t: GGMLQuantizationType = qtype,
    ) -> None:
        # experts: [n_expert, rows, cols] in numpy order, ggml shape [cols, rows, n_expert] (gguf-py's)
        shape = [cols, rows, n_expert] if n_expert else [cols, rows]
        x = (rng.standard_normal((max(n_expert, 1) * rows, cols)) * scale).astype(np.float32)
        if t == GGMLQuantizationType.F32:
            w.add_tensor(name, shape, t, x)
        else:
            w.add_tensor(name, shape, t, llama_quant.quantize(x, t))

    def vec(name: str, n: int, around: float = 1.0) -> None:
        w.add_tensor(
            name, [n], GGMLQuantizationType.F32, (around + 0.1 * rng.standard_normal(n)).astype(np.float32)
        )

    mat("token_embd.weight", N_VOCAB, N_EMBD, 1.0)
    vec("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", N_EMBD)
    if arch not in ("gemma3",):
        mat("output.weight", N_VOCAB, N_EMBD)
    q_dim, kv_dim = N_HEAD * head_dim, N_HEAD_KV * head_dim
    for il in range(N_LAYER):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", N_EMBD)
        if arch == "lfm2" and il not in LFM2_ATTN_LAYERS:
            mat(p + "shortconv.in_proj.weight", 3 * N_EMBD, N_EMBD)
            taps = (0.5 * rng.standard_normal((N_EMBD, LFM2_L_CACHE))).astype(np.float32)
            w.add_tensor(p + "shortconv.conv.weight", [LFM2_L_CACHE, N_EMBD], GGMLQuantizationType.F32, taps)
            mat(p + "shortconv.out_proj.weight", N_EMBD, N_EMBD)
        elif arch == "granitehybrid" and il in _conv_layers(arch):
            _mamba2_tensors(p, mat, vec, w, rng)
        elif arch == "phi3":
            mat(p + "attn_qkv.weight", q_dim + 2 * kv_dim, N_EMBD)
        else:
            mat(p + "attn_q.weight", q_dim, N_EMBD)
            mat(p + "attn_k.weight", kv_dim, N_EMBD)
            mat(p + "attn_v.weight", kv_dim, N_EMBD)
        if arch in ("qwen2", "gpt-oss"):
            vec(p + "attn_q.bias", q_dim, 0.0)
            vec(p + "attn_k.bias", kv_dim, 0.0)
            vec(p + "attn_v.bias", kv_dim, 0.0)
        if arch in ("qwen3", "gemma3", "qwen3moe", "lfm2") and il not in _conv_layers(arch):
            vec(p + "attn_q_norm.weight", HEAD_DIM)
            vec(p + "attn_k_norm.weight", HEAD_DIM)
        if il not in _conv_layers(arch):
            mat(p + "attn_output.weight", N_EMBD, q_dim)
        if oss:  # the output bias, the sinks [n_head], and the FFN's norm named post_attention_norm
            vec(p + "attn_output.bias", N_EMBD, 0.0)
            w.add_tensor(
                p + "attn_sinks.weight",
                [N_HEAD],
                GGMLQuantizationType.F32,
                (0.5 + 2.0 * rng.standard_normal(N_HEAD)).astype(np.float32),
            )
            vec(p + "post_attention_norm.weight", N_EMBD)
        else:
            vec(p + "ffn_norm.weight", N_EMBD)
        if arch == "phi3":
            mat(p + "ffn_up.weight", 2 * N_FF, N_EMBD)
        elif moe:
            et = qtype if expert_qtype is None else expert_qtype
            mat(p + "ffn_gate_inp.weight", N_EXPERT, N_EMBD, 1.0, t=GGMLQuantizationType.F32)
            gu = 0.5 if oss else 0.3  # gpt-oss: wide enough that swiglu_oai's clamp at 7 is reached
            ff = N_FF if arch == "granitehybrid" else N_FF_EXP  # granite: feed_forward_length per expert
            mat(p + "ffn_gate_exps.weight", ff, N_EMBD, gu, n_expert=N_EXPERT, t=et)
            mat(p + "ffn_up_exps.weight", ff, N_EMBD, gu, n_expert=N_EXPERT, t=et)
            mat(p + "ffn_down_exps.weight", N_EMBD, ff, n_expert=N_EXPERT, t=et)
            if oss:  # ggml shapes [n_expert], [n_ff_exp, n_expert], [n_embd, n_expert]
                for name, rows in (
                    ("ffn_gate_inp", 1),
                    ("ffn_gate_exps", N_FF_EXP),
                    ("ffn_up_exps", N_FF_EXP),
                ):
                    shape = [N_EXPERT] if rows == 1 else [rows, N_EXPERT]
                    b = (0.5 * rng.standard_normal(rows * N_EXPERT)).astype(np.float32)
                    w.add_tensor(p + name + ".bias", shape, GGMLQuantizationType.F32, b)
                b = (0.1 * rng.standard_normal(N_EMBD * N_EXPERT)).astype(np.float32)
                w.add_tensor(p + "ffn_down_exps.bias", [N_EMBD, N_EXPERT], GGMLQuantizationType.F32, b)
            if arch == "granitehybrid":  # the shared expert, added ungated
                mat(p + "ffn_gate_shexp.weight", N_FF_SHEXP, N_EMBD)
                mat(p + "ffn_up_shexp.weight", N_FF_SHEXP, N_EMBD)
                mat(p + "ffn_down_shexp.weight", N_EMBD, N_FF_SHEXP)
        else:
            mat(p + "ffn_gate.weight", N_FF, N_EMBD)
            mat(p + "ffn_up.weight", N_FF, N_EMBD)
        if not moe:
            mat(p + "ffn_down.weight", N_EMBD, N_FF)
        if arch == "gemma3":
            vec(p + "post_attention_norm.weight", N_EMBD)
            vec(p + "post_ffw_norm.weight", N_EMBD)
    if extra is not None:
        extra(w, rng)
    w.finish()
    return path


def _conv_layers(arch: str) -> tuple[int, ...]:
    attn = {"lfm2": LFM2_ATTN_LAYERS, "granitehybrid": GRANITE_ATTN_LAYERS}.get(arch)
    return () if attn is None else tuple(il for il in range(N_LAYER) if il not in attn)


def _mamba2_tensors(p: str, mat: Callable[..., None], vec: Callable[..., None], w: GGUFWriter, rng) -> None:  # type: ignore[no-untyped-def]
    """A Mamba-2 block's tensors in llama.cpp's layout: ssm_a negative (-exp(A_log), as converted)."""
    f32 = GGMLQuantizationType.F32
    d_inner, d_state, n_head = (
        GRANITE_SSM["inner_size"],
        GRANITE_SSM["state_size"],
        GRANITE_SSM["time_step_rank"],
    )
    d_conv, n_group = GRANITE_SSM["conv_kernel"], GRANITE_SSM["group_count"]
    conv_dim = d_inner + 2 * n_group * d_state
    mat(p + "ssm_in.weight", 2 * d_inner + 2 * n_group * d_state + n_head, N_EMBD)
    taps = (0.5 * rng.standard_normal((conv_dim, d_conv))).astype(np.float32)
    w.add_tensor(p + "ssm_conv1d.weight", [d_conv, conv_dim], f32, taps)
    vec(p + "ssm_conv1d.bias", conv_dim, 0.0)
    vec(p + "ssm_dt.bias", n_head, 0.0)
    a = (-np.exp(0.5 * rng.standard_normal(n_head))).astype(np.float32)
    w.add_tensor(p + "ssm_a", [1, n_head], f32, a)
    w.add_tensor(p + "ssm_d", [1, n_head], f32, (1.0 + 0.3 * rng.standard_normal(n_head)).astype(np.float32))
    w.add_tensor(
        p + "ssm_norm.weight",
        [d_inner // n_group, n_group],
        f32,
        (1.0 + 0.1 * rng.standard_normal(d_inner)).astype(np.float32),
    )
    mat(p + "ssm_out.weight", N_EMBD, d_inner)


ARCHES = [
    "llama",
    "qwen2",
    "qwen3",
    "phi3",
    "gemma3",
    "qwen3moe",
    "smollm3",
    "mistral3",
    "lfm2",
    "gpt-oss",
    "granitehybrid",
    "qwen35",
    "qwen35moe",
    "gemma4",
]
