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
    moe = arch == "qwen3moe" if moe is None else moe
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
        "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM,
        "vocab_size": N_VOCAB,
    }.items():
        w.add_metadata(a + key, value, GGUFValueType.UINT32)
    w.add_metadata(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_metadata(a + "rope.freq_base", 10000.0)
    if arch == "gemma3":
        w.add_metadata(a + "attention.sliding_window", 4, GGUFValueType.UINT32)
    if moe:
        w.add_metadata(a + "expert_count", N_EXPERT, GGUFValueType.UINT32)
        w.add_metadata(a + "expert_used_count", N_EXPERT_USED, GGUFValueType.UINT32)
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
    vec("output_norm.weight", N_EMBD)
    if arch not in ("gemma3",):
        mat("output.weight", N_VOCAB, N_EMBD)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    for il in range(N_LAYER):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", N_EMBD)
        if arch == "phi3":
            mat(p + "attn_qkv.weight", q_dim + 2 * kv_dim, N_EMBD)
        else:
            mat(p + "attn_q.weight", q_dim, N_EMBD)
            mat(p + "attn_k.weight", kv_dim, N_EMBD)
            mat(p + "attn_v.weight", kv_dim, N_EMBD)
        if arch == "qwen2":
            vec(p + "attn_q.bias", q_dim, 0.0)
            vec(p + "attn_k.bias", kv_dim, 0.0)
            vec(p + "attn_v.bias", kv_dim, 0.0)
        if arch in ("qwen3", "gemma3", "qwen3moe"):
            vec(p + "attn_q_norm.weight", HEAD_DIM)
            vec(p + "attn_k_norm.weight", HEAD_DIM)
        mat(p + "attn_output.weight", N_EMBD, q_dim)
        vec(p + "ffn_norm.weight", N_EMBD)
        if arch == "phi3":
            mat(p + "ffn_up.weight", 2 * N_FF, N_EMBD)
        elif moe:
            et = qtype if expert_qtype is None else expert_qtype
            mat(p + "ffn_gate_inp.weight", N_EXPERT, N_EMBD, 1.0, t=GGMLQuantizationType.F32)
            mat(p + "ffn_gate_exps.weight", N_FF_EXP, N_EMBD, n_expert=N_EXPERT, t=et)
            mat(p + "ffn_up_exps.weight", N_FF_EXP, N_EMBD, n_expert=N_EXPERT, t=et)
            mat(p + "ffn_down_exps.weight", N_EMBD, N_FF_EXP, n_expert=N_EXPERT, t=et)
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


ARCHES = ["llama", "qwen2", "qwen3", "phi3", "gemma3", "qwen3moe", "smollm3", "mistral3"]
