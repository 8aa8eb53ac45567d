"""A tiny random-weight gemma4 model, written with gguf-io's writer in the tensor layout llama.cpp's
converter produces (the E2B/E4B shape: per-layer inputs and layers sharing keys and values).

Six layers, pattern SWA, SWA, SWA, global, SWA, global; the last two share: layer 4 reads layer 2's keys and
values, layer 5 layer 3's. Sliding-window layers: heads of 16, a window of 4, all 16 dimensions rotated with
base 10,000; global layers: heads of 32, base 1,000,000, proportional RoPE (``rope_freqs``: the first 4 of 16
frequency pairs rotate, the others are divided by 1e30). Layer 3 has no ``attn_v`` (its values are its
keys). Per-layer inputs of 16 per layer, a scalar on every layer's output, final logits soft-capped at 30.
With ``wide_shared``, ``feed_forward_length`` is per layer: the two sharing layers' FFNs twice as wide.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tiny_models import N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_VOCAB, _byte_tokens

import llama_quant
from gguf_io import GGMLQuantizationType, GGUFValueType, GGUFWriter

GEMMA4_SWA_PATTERN = (True, True, True, False, True, False)
GEMMA4_LAYERS = len(GEMMA4_SWA_PATTERN)
GEMMA4_SHARED_KV = 2  # layers 4 and 5 keep no keys and values
GEMMA4_WINDOW = 4
GEMMA4_HEAD_DIM = 32  # global layers
GEMMA4_HEAD_DIM_SWA = 16
GEMMA4_PER_LAYER = 16  # embedding_length_per_layer_input
GEMMA4_NO_V = 3  # the layer whose values are its keys
GEMMA4_ROTATED_PAIRS = 4  # of the global layers' 16 pairs


def write_tiny_gemma4(path: Path, seed: int = 0, wide_shared: bool = False) -> Path:
    n_kv = GEMMA4_LAYERS - GEMMA4_SHARED_KV
    n_ff = [N_FF * (2 if wide_shared and il >= n_kv else 1) for il in range(GEMMA4_LAYERS)]
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path)
    a = "gemma4."
    u32, f32v = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    w.add_metadata("general.architecture", "gemma4")
    w.add_metadata("general.name", "tiny-gemma4")
    for key, value in {
        "block_count": GEMMA4_LAYERS,
        "context_length": 256,
        "embedding_length": N_EMBD,
        "attention.head_count": N_HEAD,
        "attention.head_count_kv": N_HEAD_KV,
        "attention.key_length": GEMMA4_HEAD_DIM,
        "attention.value_length": GEMMA4_HEAD_DIM,
        "attention.key_length_swa": GEMMA4_HEAD_DIM_SWA,
        "attention.value_length_swa": GEMMA4_HEAD_DIM_SWA,
        "rope.dimension_count": GEMMA4_HEAD_DIM,
        "rope.dimension_count_swa": GEMMA4_HEAD_DIM_SWA,
        "attention.sliding_window": GEMMA4_WINDOW,
        "attention.shared_kv_layers": GEMMA4_SHARED_KV,
        "embedding_length_per_layer_input": GEMMA4_PER_LAYER,
        "vocab_size": N_VOCAB,
    }.items():
        w.add_metadata(a + key, value, u32)
    if not wide_shared:
        w.add_metadata(a + "feed_forward_length", N_FF, u32)
    if wide_shared:
        w.add_metadata(a + "feed_forward_length", np.array(n_ff, np.int32))
    w.add_metadata(a + "attention.sliding_window_pattern", list(GEMMA4_SWA_PATTERN))
    w.add_metadata(a + "attention.layer_norm_rms_epsilon", 1e-6, f32v)
    w.add_metadata(a + "rope.freq_base", 1000000.0, f32v)
    w.add_metadata(a + "rope.freq_base_swa", 10000.0, f32v)
    w.add_metadata(a + "final_logit_softcapping", 30.0, f32v)
    w.add_metadata("tokenizer.ggml.model", "gpt2")
    w.add_metadata("tokenizer.ggml.pre", "default")
    w.add_metadata("tokenizer.ggml.tokens", [*_byte_tokens(), "<s>", "</s>", "<pad>"])
    w.add_metadata("tokenizer.ggml.token_type", np.array([1] * 256 + [3, 3, 3], np.int32))
    w.add_metadata("tokenizer.ggml.merges", [], GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_metadata("tokenizer.ggml.bos_token_id", 256, u32)
    w.add_metadata("tokenizer.ggml.eos_token_id", 257, u32)

    q8, f16, f32 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.F16, GGMLQuantizationType.F32

    def mat(name: str, rows: int, cols: int, scale: float = 0.3) -> None:
        x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        t = q8 if cols % 32 == 0 else f16
        w.add_tensor(name, [cols, rows], t, llama_quant.quantize(x, t))

    def vec(name: str, n: int, around: float = 1.0, spread: float = 0.1) -> None:
        w.add_tensor(name, [n], f32, (around + spread * rng.standard_normal(n)).astype(np.float32))

    # the converter's proportional RoPE: the unrotated pairs' frequencies divided by 1e30
    pairs = GEMMA4_HEAD_DIM // 2
    factors = np.where(np.arange(pairs) < GEMMA4_ROTATED_PAIRS, 1.0, 1e30).astype(np.float32)
    w.add_tensor("rope_freqs.weight", [pairs], f32, factors)
    mat("token_embd.weight", N_VOCAB, N_EMBD, 0.5)  # the output head too (tied)
    vec("output_norm.weight", N_EMBD)
    n_pl = GEMMA4_LAYERS * GEMMA4_PER_LAYER
    mat("per_layer_token_embd.weight", N_VOCAB, n_pl, 1.0)
    mat("per_layer_model_proj.weight", n_pl, N_EMBD)
    vec("per_layer_proj_norm.weight", GEMMA4_PER_LAYER)
    for il, swa in enumerate(GEMMA4_SWA_PATTERN):
        p = f"blk.{il}."
        hd = GEMMA4_HEAD_DIM_SWA if swa else GEMMA4_HEAD_DIM
        has_kv = il < GEMMA4_LAYERS - GEMMA4_SHARED_KV
        vec(p + "attn_norm.weight", N_EMBD)
        mat(p + "attn_q.weight", N_HEAD * hd, N_EMBD)
        if has_kv:
            mat(p + "attn_k.weight", N_HEAD_KV * hd, N_EMBD)
            if il != GEMMA4_NO_V:
                mat(p + "attn_v.weight", N_HEAD_KV * hd, N_EMBD)
            vec(p + "attn_k_norm.weight", hd)
        vec(p + "attn_q_norm.weight", hd)
        mat(p + "attn_output.weight", N_EMBD, N_HEAD * hd)
        vec(p + "post_attention_norm.weight", N_EMBD)
        vec(p + "ffn_norm.weight", N_EMBD)
        mat(p + "ffn_gate.weight", n_ff[il], N_EMBD)
        mat(p + "ffn_up.weight", n_ff[il], N_EMBD)
        mat(p + "ffn_down.weight", N_EMBD, n_ff[il])
        vec(p + "post_ffw_norm.weight", N_EMBD)
        mat(p + "inp_gate.weight", GEMMA4_PER_LAYER, N_EMBD)
        mat(p + "proj.weight", N_EMBD, GEMMA4_PER_LAYER)
        vec(p + "post_norm.weight", N_EMBD)
        vec(p + "layer_output_scale.weight", 1, 0.8, 0.2)
    w.finish()
    return path
