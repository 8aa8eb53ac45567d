"""Random-weight models of realistic proportions for the benchmarks: a ``qwen3moe`` (32 experts, 4 chosen)
and a ``qwen35moe`` hybrid (gated delta-net and attention layers, 64 experts, 8 chosen, a shared expert),
each about 1 GB at Q4_K_M.

No such files can be downloaded offline, and speed does not depend on what the weights say, only on their
shapes and types. Each model is written once per machine in F16 (the routers in F32) with gguf-io's writer, quantized to Q4_K_M
with ``llama-quant`` (llama-quantize's per-tensor mix, the same bytes), and kept in
``~/.cache/llama-py/bench``; the F16 file is removed afterwards.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gguf_io import GGMLQuantizationType, GGUFValueType, GGUFWriter

CACHE = Path.home() / ".cache" / "llama-py" / "bench"
N_VOCAB = 32000
F16, F32 = GGMLQuantizationType.F16, GGMLQuantizationType.F32
U32 = GGUFValueType.UINT32

# qwen3moe: Qwen3-30B-A3B's layout (GQA 32/4 of 128, Q/K norms, 128 experts of 768, 8 chosen) at a width
# and depth that make about 1 GB: 1,024 wide, 28 layers, 32 experts of 512, 4 chosen.
QWEN3MOE = {
    "n_embd": 1024,
    "n_layer": 28,
    "n_head": 16,
    "n_head_kv": 4,
    "head_dim": 128,
    "n_expert": 32,
    "n_expert_used": 4,
    "n_ff_exp": 512,
}
# qwen35moe: Qwen3.5-35B-A3B's layout (three delta-net layers to one gated attention layer, 16 key heads and
# 32 value heads of 128, attention 16/2 heads of 256 with a quarter rotated, 256 experts of 512, 8 chosen,
# a gated shared expert) at 1,024 wide, 24 layers, 8/16 delta-net heads, 64 experts of 256, 8 chosen.
QWEN35MOE = {
    "n_embd": 1024,
    "n_layer": 24,
    "n_head": 8,
    "n_head_kv": 2,
    "head_dim": 256,
    "interval": 4,
    "ssm_groups": 8,
    "ssm_v_heads": 16,
    "ssm_state": 128,
    "ssm_taps": 4,
    "n_expert": 64,
    "n_expert_used": 8,
    "n_ff_exp": 256,
    "n_ff_shexp": 256,
}


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode map: every byte one token."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)  # 188 bytes print as themselves; the rest from U+0100 on
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


def _tokenizer(w: GGUFWriter) -> None:
    """A byte-level BPE vocabulary of N_VOCAB tokens (256 bytes, filler pieces, three specials)."""
    tokens = [*_byte_tokens(), *(f"t{i}" for i in range(N_VOCAB - 259)), "<s>", "</s>", "<pad>"]
    w.add_metadata("tokenizer.ggml.model", "gpt2")
    w.add_metadata("tokenizer.ggml.pre", "default")
    w.add_metadata("tokenizer.ggml.tokens", tokens)
    types = np.ones(N_VOCAB, np.int32)
    types[-3:] = 3
    w.add_metadata("tokenizer.ggml.token_type", types)
    w.add_metadata("tokenizer.ggml.merges", [], GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add_metadata("tokenizer.ggml.bos_token_id", N_VOCAB - 3, U32)
    w.add_metadata("tokenizer.ggml.eos_token_id", N_VOCAB - 2, U32)


def _tensors(w: GGUFWriter, rng: np.random.Generator) -> tuple[Callable[..., None], Callable[..., None]]:
    def mat(name: str, rows: int, cols: int, n_expert: int = 0, scale: float | None = None) -> None:
        shape = [cols, rows, n_expert] if n_expert else [cols, rows]
        s = np.float32(scale if scale is not None else 1.0 / np.sqrt(cols))
        x = rng.standard_normal((max(n_expert, 1) * rows, cols), np.float32) * s
        if name.endswith("ffn_gate_inp.weight"):  # the router: F32, as llama.cpp's converter writes it
            w.add_tensor(name, shape, F32, x)
        else:
            w.add_tensor(name, shape, F16, x.astype(np.float16))

    def vec(name: str, n: int, around: float = 1.0, spread: float = 0.1) -> None:
        x = (around + spread * rng.standard_normal(n)).astype(np.float32)
        w.add_tensor(name, [n], F32, x)

    return mat, vec


def _start(
    arch: str, path: Path, c: dict[str, int], extra: dict[str, int], rope_base: float
) -> tuple[GGUFWriter, Callable[..., None], Callable[..., None]]:
    """A writer of ``arch`` with the hyperparameters both models share (and ``extra``), the tokenizer, the
    embeddings, the output norm and the output matrix; its ``mat`` and ``vec`` for the layers."""
    w = GGUFWriter(path)
    a = arch + "."
    w.add_metadata("general.architecture", arch)
    w.add_metadata("general.name", f"bench-{arch}")
    d, hd = c["n_embd"], c["head_dim"]
    keys = {
        "block_count": c["n_layer"],
        "embedding_length": d,
        "feed_forward_length": 3 * d,
        "attention.head_count": c["n_head"],
        "attention.head_count_kv": c["n_head_kv"],
        "attention.key_length": hd,
        "attention.value_length": hd,
        "vocab_size": N_VOCAB,
        "expert_count": c["n_expert"],
        "expert_used_count": c["n_expert_used"],
        "expert_feed_forward_length": c["n_ff_exp"],
    }
    for key, value in {**keys, **extra}.items():
        w.add_metadata(a + key, value, U32)
    w.add_metadata(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_metadata(a + "rope.freq_base", rope_base)
    _tokenizer(w)
    mat, vec = _tensors(w, np.random.default_rng(0))
    mat("token_embd.weight", N_VOCAB, d, scale=1.0)
    vec("output_norm.weight", d)
    mat("output.weight", N_VOCAB, d)
    return w, mat, vec


def _experts(mat: Callable[..., None], p: str, d: int, c: dict[str, int]) -> None:
    """A layer's router and routed experts."""
    ne, ff = c["n_expert"], c["n_ff_exp"]
    mat(p + "ffn_gate_inp.weight", ne, d, scale=1.0)
    mat(p + "ffn_gate_exps.weight", ff, d, ne)
    mat(p + "ffn_up_exps.weight", ff, d, ne)
    mat(p + "ffn_down_exps.weight", d, ff, ne)


def _write_qwen3moe(path: Path) -> None:
    c = QWEN3MOE
    w, mat, vec = _start("qwen3moe", path, c, {"context_length": 40960}, 1000000.0)
    d, hd = c["n_embd"], c["head_dim"]
    q_dim, kv_dim = c["n_head"] * hd, c["n_head_kv"] * hd
    for il in range(c["n_layer"]):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", d)
        mat(p + "attn_q.weight", q_dim, d)
        mat(p + "attn_k.weight", kv_dim, d)
        mat(p + "attn_v.weight", kv_dim, d)
        vec(p + "attn_q_norm.weight", hd)
        vec(p + "attn_k_norm.weight", hd)
        mat(p + "attn_output.weight", d, q_dim)
        vec(p + "ffn_norm.weight", d)
        _experts(mat, p, d, c)
    w.finish()


def _write_qwen35moe(path: Path) -> None:
    c = QWEN35MOE
    groups, v_heads, state, taps = c["ssm_groups"], c["ssm_v_heads"], c["ssm_state"], c["ssm_taps"]
    d, hd = c["n_embd"], c["head_dim"]
    extra = {
        "context_length": 262144,
        "rope.dimension_count": hd // 4,
        "full_attention_interval": c["interval"],
        "ssm.conv_kernel": taps,
        "ssm.state_size": state,
        "ssm.group_count": groups,
        "ssm.time_step_rank": v_heads,
        "ssm.inner_size": v_heads * state,
        "expert_shared_feed_forward_length": c["n_ff_shexp"],
    }
    w, mat, vec = _start("qwen35moe", path, c, extra, 10000000.0)
    w.add_metadata("qwen35moe.rope.dimension_sections", np.array([11, 11, 10, 0], np.int32))
    rng = np.random.default_rng(1)
    key_dim, value_dim = groups * state, v_heads * state
    conv_dim = 2 * key_dim + value_dim
    ffs = c["n_ff_shexp"]
    for il in range(c["n_layer"]):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", d)
        vec(p + "post_attention_norm.weight", d)
        if (il + 1) % c["interval"] == 0:
            mat(p + "attn_q.weight", 2 * c["n_head"] * hd, d)  # query and gate per head
            mat(p + "attn_k.weight", c["n_head_kv"] * hd, d)
            mat(p + "attn_v.weight", c["n_head_kv"] * hd, d)
            mat(p + "attn_output.weight", d, c["n_head"] * hd)
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        else:
            mat(p + "attn_qkv.weight", conv_dim, d)
            mat(p + "attn_gate.weight", value_dim, d)
            mat(p + "ssm_beta.weight", v_heads, d)
            mat(p + "ssm_alpha.weight", v_heads, d)
            conv = (0.5 * rng.standard_normal((conv_dim, taps))).astype(np.float32)
            w.add_tensor(p + "ssm_conv1d.weight", [taps, conv_dim], F32, conv)
            vec(p + "ssm_dt.bias", v_heads, 0.5, 0.5)
            vec(p + "ssm_a", v_heads, -0.5, 0.3)  # -exp(A_log)
            vec(p + "ssm_norm.weight", state)
            mat(p + "ssm_out.weight", d, value_dim)
        _experts(mat, p, d, c)
        vec(p + "ffn_gate_inp_shexp.weight", d, 0.0, 0.3)
        mat(p + "ffn_gate_shexp.weight", ffs, d)
        mat(p + "ffn_up_shexp.weight", ffs, d)
        mat(p + "ffn_down_shexp.weight", d, ffs)
    w.finish()


WRITERS: dict[str, Callable[[Path], None]] = {"qwen3moe": _write_qwen3moe, "qwen35moe": _write_qwen35moe}


def model_path(arch: str, qtype: str = "Q4_K_M") -> Path:
    """The ``arch`` benchmark model quantized to ``qtype``: written and quantized on first use."""
    out = CACHE / f"bench-{arch}-{qtype}.gguf"
    if out.is_file():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    f16 = CACHE / f"bench-{arch}-F16.gguf.part"
    t = time.perf_counter()
    _say(f"writing the {arch} benchmark model (F16, random weights) to {f16}")
    WRITERS[arch](f16)
    _say(f"quantizing it to {qtype} with llama-quant ({time.perf_counter() - t:.0f} s so far)")
    tmp = out.with_suffix(".part")
    cmd = [str(Path(sys.executable).parent / "llama-quant"), str(f16), str(tmp), qtype]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    tmp.rename(out)
    f16.unlink()
    _say(f"{out}: {out.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t:.0f} s")
    return out


if __name__ == "__main__":
    for name in sys.argv[1:] or list(WRITERS):
        print(model_path(name))
