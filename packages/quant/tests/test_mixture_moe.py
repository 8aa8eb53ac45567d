"""The mixture rules on MoE, hybrid and recurrent layouts (no llama.cpp needed: the expected types are
llama-quantize's, as test_moe_parity checks on the same layouts)."""

from __future__ import annotations

import moe_models
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES

from gguf_io import GGMLQuantizationType as T
from llama_quant import quantize
from llama_quant.mixture import (
    MixtureParams,
    ModelInfo,
    TensorSpec,
    parse_file_type,
    plan_types,
    weight_order,
)
from llama_quant.plan import TensorPlan, convert_tensor


def plan(layout: moe_models.Layout, name: str) -> dict[str, str]:
    specs = {n: TensorSpec(n, shape, qtype) for n, shape, qtype in layout.tensors}
    ordered = [specs[n] for n in weight_order(list(specs))]
    ft = parse_file_type(name).ftype
    return {
        n: t.name
        for n, t in plan_types(
            ordered, ModelInfo.from_metadata(layout.metadata()), MixtureParams(ft)
        ).types.items()
    }


def test_eight_experts_bump_attention_and_down_projections():
    types = plan(moe_models.qwen3moe(), "Q4_K_M")
    for i in range(8):
        assert types[f"blk.{i}.attn_v.weight"] == types[f"blk.{i}.attn_k.weight"] == "Q8_0"
        assert types[f"blk.{i}.attn_output.weight"] == "Q5_K"
        assert types[f"blk.{i}.ffn_gate_exps.weight"] == types[f"blk.{i}.ffn_up_exps.weight"] == "Q4_K"
        # use_more_bits by the layer number parsed from the name (n_expert > 1)
        assert types[f"blk.{i}.ffn_down_exps.weight"] == ("Q6_K" if i in (0, 3, 6, 7) else "Q4_K")
        assert types[f"blk.{i}.ffn_gate_inp.weight"] == types[f"blk.{i}.attn_q_norm.weight"] == "F32"
    assert types["token_embd.weight"] == "Q6_K"  # tied: the output tensor's rule


def test_other_expert_counts_keep_the_dense_attention_rules():
    types = plan(moe_models.qwen3moe(n_expert=16), "Q4_K_M")
    assert types["blk.1.attn_k.weight"] == "Q4_K"
    assert types["blk.0.attn_v.weight"] == "Q6_K" and types["blk.1.attn_v.weight"] == "Q4_K"


def test_mxfp4_moe_keeps_mxfp4_experts_and_makes_the_rest_q8_0():
    layout = moe_models.gpt_oss()
    types = plan(layout, "MXFP4_MOE")
    for name, shape, _ in layout.tensors:
        if name.endswith("_exps.weight"):
            assert types[name] == "MXFP4"
        elif len(shape) == 1 or not name.endswith("weight") or "ffn_gate_inp" in name:
            assert types[name] == "F32", name  # norms, sinks, biases (2-D expert biases too), the router
        else:
            assert types[name] == "Q8_0", name
    f16 = plan(moe_models.gpt_oss(expert_type=T.F16), "MXFP4_MOE")
    assert f16["blk.3.ffn_down_exps.weight"] == "MXFP4"


def test_rows_of_320_fall_back_per_expert_tensor():
    types = plan(moe_models.gpt_oss(), "Q4_K_M")
    assert types["blk.1.ffn_gate_exps.weight"] == types["blk.1.ffn_down_exps.weight"] == "Q5_0"
    assert types["blk.0.ffn_down_exps.weight"] == "Q8_0"  # Q6_K bump, then its fallback
    assert types["blk.0.attn_output.weight"] == "Q4_K"  # 512-long rows
    assert types["output.weight"] == "Q8_0" and types["token_embd.weight"] == "Q5_0"


def test_fused_qkv_of_recurrent_layers_counts_as_attention_v():
    types = plan(moe_models.qwen35moe(), "Q4_K_M")
    # 8 attention-v tensors (6 attn_qkv, 2 attn_v): use_more_bits over that count
    wv = [types[f"blk.{i}.attn_v.weight" if i in (3, 7) else f"blk.{i}.attn_qkv.weight"] for i in range(8)]
    assert wv == ["Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q6_K"]
    assert types["blk.0.ffn_down_exps.weight"] == "Q8_0" and types["blk.1.ffn_down_exps.weight"] == "Q5_0"
    assert types["blk.0.ffn_down_shexp.weight"] == "Q6_K"
    for kept in ("ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ssm_norm.weight", "ffn_gate_inp_shexp.weight"):
        assert types[f"blk.0.{kept}"] in ("F32", "F16"), kept
    assert types["blk.0.ssm_beta.weight"] == types["blk.0.attn_gate.weight"] == "Q4_K"


def test_hybrid_gqa_is_read_from_layer_zero():
    # head_count_kv [0, 0, 0, 1, ...]: layer 0 is a Mamba-2 layer, so n_gqa() is 0 and Q2_K's attn_v is Q3_K
    types = plan(moe_models.granitehybrid(), "Q2_K")
    assert types["blk.3.attn_v.weight"] == types["blk.7.attn_v.weight"] == "Q3_K"
    assert types["blk.0.ssm_in.weight"] == types["blk.0.ssm_out.weight"] == "Q2_K"
    for kept in ("ssm_a", "ssm_d", "ssm_norm.weight", "ssm_conv1d.bias"):
        assert types[f"blk.0.{kept}"] == "F32", kept
    assert types["blk.0.ssm_conv1d.weight"] == "F16"


def test_short_convolution_weights_stay_unquantized():
    types = plan(moe_models.lfm2(), "Q4_K_M")
    assert types["blk.0.shortconv.conv.weight"] == "F16"
    assert types["blk.0.shortconv.in_proj.weight"] == "Q4_K"
    assert types["token_embd_norm.weight"] == "F32"


def test_expert_tensor_uses_each_experts_importance_slice():
    rng = np.random.default_rng(0)
    ne0, rows, n_expert = 256, 3, 4
    x = rng.standard_normal((n_expert, rows, ne0)).astype(np.float32)
    imat = np.exp(rng.normal(0, 1, (n_expert, ne0))).astype(np.float32)
    shape = (ne0, rows, n_expert)
    nbytes = ne0 // 256 * GGML_QUANT_SIZES[T.Q4_K][1] * rows * n_expert
    p = TensorPlan("blk.0.ffn_up_exps.weight", shape, T.F32, T.Q4_K, x.nbytes, nbytes, imat.ravel())
    got = convert_tensor(x.view(np.uint8).ravel(), p, max_buf_size=1)  # one row per slab
    want = np.concatenate([np.asarray(quantize(x[e], T.Q4_K, imat[e])).ravel() for e in range(n_expert)])
    assert np.array_equal(got, want)
    assert not np.array_equal(got, np.asarray(quantize(x.reshape(-1, ne0), T.Q4_K, imat[0])).ravel())


@pytest.mark.parametrize("arch", sorted(moe_models.LAYOUTS))
def test_every_layout_plans_every_tensor(arch):
    layout = moe_models.LAYOUTS[arch]()
    assert len(plan(layout, "Q4_K_M")) == len(layout.tensors)
