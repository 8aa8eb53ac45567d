"""The per-tensor type rules (llama-quant.cpp's llama_tensor_get_type and helpers) on synthetic tensor lists."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as T

from llama_quant.mixture import (
    FILE_TYPES,
    MixtureParams,
    ModelInfo,
    TensorSpec,
    allows_quantization,
    default_type,
    parse_file_type,
    parse_ggml_type,
    plan_types,
    tensor_requires_imatrix,
    weight_order,
)


def llama_tensors(n_layer: int, n_embd: int = 256, n_ff: int = 512, tied: bool = False) -> list[TensorSpec]:
    specs = [
        TensorSpec("token_embd.weight", (n_embd, 1000), T.F16),
        TensorSpec("output_norm.weight", (n_embd,), T.F32),
    ]
    if not tied:
        specs.append(TensorSpec("output.weight", (n_embd, 1000), T.F16))
    for i in range(n_layer):
        specs += [
            TensorSpec(f"blk.{i}.attn_norm.weight", (n_embd,), T.F32),
            TensorSpec(f"blk.{i}.attn_q.weight", (n_embd, n_embd), T.F16),
            TensorSpec(f"blk.{i}.attn_k.weight", (n_embd, n_embd // 4), T.F16),
            TensorSpec(f"blk.{i}.attn_v.weight", (n_embd, n_embd // 4), T.F16),
            TensorSpec(f"blk.{i}.attn_output.weight", (n_embd, n_embd), T.F16),
            TensorSpec(f"blk.{i}.ffn_gate.weight", (n_embd, n_ff), T.F16),
            TensorSpec(f"blk.{i}.ffn_up.weight", (n_embd, n_ff), T.F16),
            TensorSpec(f"blk.{i}.ffn_down.weight", (n_ff, n_embd), T.F16),
        ]
    order = weight_order([s.name for s in specs])
    by_name = {s.name: s for s in specs}
    return [by_name[n] for n in order]


def plan(ftype_name: str, n_layer: int = 32, gqa: int = 4, **kw) -> dict[str, T]:
    tensors = llama_tensors(n_layer, **{k: kw.pop(k) for k in ("n_embd", "n_ff", "tied") if k in kw})
    model = ModelInfo("llama", n_layer, n_head=8 * gqa, n_head_kv=8)
    return plan_types(tensors, model, MixtureParams(parse_file_type(ftype_name).ftype, **kw)).types


def test_weight_order_is_by_layer_then_name():
    names = ["blk.10.a.weight", "output.weight", "blk.2.b.weight", "blk.2.a.weight", "token_embd.weight"]
    assert weight_order(names) == [
        "output.weight",
        "token_embd.weight",
        "blk.2.a.weight",
        "blk.2.b.weight",
        "blk.10.a.weight",
    ]


def test_q4_k_m_uses_more_bits_on_the_right_layers():
    types = plan("Q4_K_M")
    more = [i for i in range(32) if types[f"blk.{i}.ffn_down.weight"] == T.Q6_K]
    # i < 4, i >= 28, or (i - 4) % 3 == 2
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert [i for i in range(32) if types[f"blk.{i}.attn_v.weight"] == T.Q6_K] == more
    assert types["blk.5.attn_q.weight"] == T.Q4_K
    assert types["output.weight"] == T.Q6_K
    assert types["token_embd.weight"] == T.Q4_K
    assert types["blk.0.attn_norm.weight"] == T.F32


def test_tied_embeddings_take_the_output_rule():
    assert plan("Q4_K_M", tied=True)["token_embd.weight"] == T.Q6_K


def test_q3_k_m_and_q2_k_rules():
    types = plan("Q3_K_M")
    assert [types[f"blk.{i}.attn_v.weight"] for i in range(3)] == [T.Q5_K, T.Q5_K, T.Q4_K]
    assert types["blk.0.ffn_down.weight"] == T.Q5_K and types["blk.5.ffn_down.weight"] == T.Q4_K
    assert types["blk.3.attn_output.weight"] == T.Q4_K
    q2 = plan("Q2_K", gqa=2)
    assert q2["blk.0.attn_v.weight"] == T.Q3_K and q2["blk.0.ffn_down.weight"] == T.Q3_K
    assert plan("Q2_K", gqa=4)["blk.0.attn_v.weight"] == T.Q4_K


def test_fallback_when_rows_do_not_fit_256_blocks():
    # Gemma 3 270M: 640-wide rows cannot take 256-weight blocks
    types = plan("Q4_K_M", n_layer=8, n_embd=640, n_ff=2048)
    assert types["blk.0.attn_q.weight"] == T.Q5_0  # Q4_K -> Q5_0
    assert types["blk.0.attn_v.weight"] == T.Q8_0  # Q6_K -> Q8_0
    assert types["blk.0.ffn_down.weight"] == T.Q6_K  # 2048 fits
    assert types["output.weight"] == T.Q8_0  # the output rule itself picks Q8_0
    q5 = plan("Q5_K_S", n_layer=8, n_embd=640, n_ff=2048)
    assert q5["blk.0.attn_q.weight"] == T.Q5_1
    assert plan("Q3_K_S", n_layer=8, n_embd=640)["blk.0.attn_q.weight"] == T.Q4_0
    assert plan("IQ4_XS", n_layer=8, n_embd=640)["blk.0.attn_q.weight"] == T.IQ4_NL
    # rows that fit no block at all become F16
    assert plan("Q4_0", n_layer=2, n_embd=48, n_ff=96)["blk.0.attn_q.weight"] == T.F16


def test_options():
    types = plan("Q4_K_M", pure=True)
    assert {types[n] for n in types if n.startswith("blk.") and "norm" not in n} == {T.Q4_K}
    assert plan("Q4_K_M", quantize_output_tensor=False)["output.weight"] == T.F16
    types = plan("Q4_K_M", output_tensor_type=T.Q8_0, token_embedding_type=T.Q3_K)
    assert types["output.weight"] == T.Q8_0 and types["token_embd.weight"] == T.Q3_K
    types = plan("Q4_K_M", tensor_types=[("attn_(q|k)", T.Q8_0), ("blk\\.1\\.", T.Q2_K)])
    assert types["blk.1.attn_q.weight"] == T.Q8_0 and types["blk.1.ffn_up.weight"] == T.Q2_K
    assert types["blk.1.attn_v.weight"] == T.Q2_K


def test_imatrix_changes_q4_0_ffn_down():
    assert plan("Q4_0")["blk.0.ffn_down.weight"] == T.Q4_0
    types = plan("Q4_0", has_imatrix=True)
    assert types["blk.0.ffn_down.weight"] == T.Q4_1 and types["blk.4.ffn_down.weight"] == T.Q4_0


def test_float_file_types_have_no_mixture():
    for name, t in (("F16", T.F16), ("BF16", T.BF16), ("F32", T.F32)):
        types = plan(name)
        assert types["blk.0.ffn_down.weight"] == t and types["output.weight"] == t
        assert types["blk.0.attn_norm.weight"] == T.F32


def test_allows_quantization():
    p = MixtureParams(15)
    ok = lambda name, shape=(256, 256): allows_quantization(TensorSpec(name, shape, T.F32), "llama", p)  # noqa: E731
    assert ok("blk.0.attn_q.weight")
    assert not ok("blk.0.attn_norm.weight")
    assert not ok("blk.0.attn_q.weight", (256,))
    assert not ok("blk.0.attn_q.weight", (256, 1))  # ggml_n_dims ignores trailing 1s
    assert not ok("blk.0.ffn_gate_inp.weight")
    assert not ok("blk.0.attn_q.bias")
    assert not ok("position_embd.weight")
    assert allows_quantization(TensorSpec("x.weight", (32, 32, 8), T.F32), "llama", p)


def test_requires_imatrix():
    assert tensor_requires_imatrix("blk.0.attn_q.weight", T.IQ2_XXS, 19)
    assert not tensor_requires_imatrix("token_embd.weight", T.IQ2_XXS, 19)
    assert tensor_requires_imatrix("blk.0.attn_q.weight", T.Q2_K, 21)
    assert not tensor_requires_imatrix("blk.0.attn_q.weight", T.Q2_K, 10)


@pytest.mark.parametrize(
    ("text", "name", "ftype"),
    [("q4_k_m", "Q4_K_M", 15), ("15", "Q4_K", 15), ("12", "Q3_K", 12), ("0", "F32", 0), ("copy", "COPY", 0)],
)
def test_parse_file_type(text, name, ftype):
    ft = parse_file_type(text)
    assert ft is not None and (ft.name, ft.ftype) == (name, ftype)


def test_parse_errors_and_ggml_types():
    assert parse_file_type("Q9_9") is None and parse_file_type("4") is None
    assert parse_ggml_type("q5_k") == T.Q5_K and parse_ggml_type("F16") == T.F16
    assert parse_ggml_type("q4_k_m") is None
    assert all(default_type(ft.ftype) is not None for ft in FILE_TYPES if ft.name not in ("Q1_0", "Q2_0"))
