"""The MoE FFN layer kind against its plain-numpy reference of llama.cpp's build_moe_ffn (layers/ref.py):
routing (gating, top-k with ties, weight normalisation and scale), the grouped expert products and the
weighted sum, shared experts, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import llama_quant
from gguf_io import GGMLQuantizationType as T
from llama_engine.arch.workspace import Workspace
from llama_engine.layers import Gating, MoE, MoEConfig
from llama_engine.layers import ref as layers_ref
from llama_engine.layers.routing import route, stl_sort_desc
from llama_quant.kernels import ExactMatrix, ExpertMatrix

N_EMBD, N_FF, N_FF_SHARED = 64, 32, 64


def _raw(rng: np.random.Generator, rows: int, cols: int, qtype: T, scale: float = 0.3) -> np.ndarray:
    x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    raw = x if qtype == T.F32 else llama_quant.quantize(x, qtype)
    return np.frombuffer(np.ascontiguousarray(raw).tobytes(), np.uint8)


def _m(raw: np.ndarray, qtype: T, rows: int, cols: int) -> ExactMatrix:
    return ExactMatrix(raw, qtype, rows, cols)


def _route(logits: np.ndarray, k: int, gating: Gating, norm: bool, scale: float):  # type: ignore[no-untyped-def]
    n, e = logits.shape
    probs, order = np.zeros((n, e), np.float32), np.zeros((n, e), np.int32)
    sel, w = np.zeros((n, k), np.int32), np.zeros((n, k), np.float32)
    route(logits, probs, order, sel, w, n, e, k, int(gating), norm, np.float32(scale))
    return sel, w


@pytest.mark.parametrize("n_expert", [8, 10])  # 10: ggml's softmax takes two values past its groups of four
@pytest.mark.parametrize(
    ("gating", "norm", "scale"),
    [
        (Gating.SOFTMAX, True, 0.0),
        (Gating.SOFTMAX, False, 2.5),
        (Gating.SIGMOID, True, 1.0),
        (Gating.SOFTMAX_WEIGHT, False, 0.0),
    ],
)
def test_route_matches_reference(n_expert: int, gating: Gating, norm: bool, scale: float) -> None:
    rng = np.random.default_rng(n_expert)
    logits = (rng.standard_normal((12, n_expert)) * 3).astype(np.float32)
    logits[3, 2] = logits[3, 5] = logits[3].max() + 1  # a tie at the top: the lower index comes first
    logits[4, :] = 0.5  # all equal
    sel, w = _route(logits, 3, gating, norm, scale)
    assert sel[3, :2].tolist() == [2, 5] and sel[4].tolist() == [0, 1, 2]
    for t in range(len(logits)):
        ref_sel, ref_w = layers_ref.route(logits[t], 3, gating, norm, scale)
        assert sel[t].tolist() == ref_sel.tolist()
        np.testing.assert_array_equal(w[t], ref_w)
    if norm:
        np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-6)


def test_sort_keeps_the_order_of_ties_up_to_16_and_sorts_any_length() -> None:
    rng = np.random.default_rng(0)
    for n in (5, 16, 17, 128, 300):
        p = (rng.integers(0, 4, n) / 3).astype(np.float32)  # many ties
        v = np.arange(n, dtype=np.int32)
        stl_sort_desc(v, p, n)
        assert sorted(v.tolist()) == list(range(n)) and np.all(np.diff(p[v]) <= 0)
        if n <= 16:  # libstdc++'s std::sort is its insertion sort there: stable
            assert v.tolist() == np.argsort(-p, kind="stable").tolist()


def _pair(rng: np.random.Generator, n_ff: int, tg: T, tu: T, d: int = N_EMBD):  # type: ignore[no-untyped-def]
    """An expert's gate and up matrices apart (the reference's), stacked [gate | up], and their raw bytes."""
    g, u = _raw(rng, n_ff, d, tg), _raw(rng, n_ff, d, tu)
    both = _m(np.concatenate([g, u]), tg, 2 * n_ff, d) if tg == tu else None
    return _m(g, tg, n_ff, d), _m(u, tu, n_ff, d), both, g, u


def _experts(raws: list[np.ndarray], qtype: T, rows: int, n_expert: int, cols: int) -> ExpertMatrix:
    """The experts' matrices of one weight (``raws``: per part, every expert's bytes) as the layer holds
    them."""
    parts = [(raw, qtype, rows) for raw in raws]
    m = ExpertMatrix.stacked(parts, n_expert, cols)
    assert m is not None
    return m


def _layer_and_reference(  # type: ignore[no-untyped-def]
    seed: int, types: tuple[T, T, T], shared: bool, cfg: MoEConfig, d: int = N_EMBD, n_ff: int = N_FF
):
    rng = np.random.default_rng(seed)
    tg, tu, td = types
    ne = cfg.n_expert
    pairs = [_pair(rng, n_ff, tg, tu, d) for e in range(ne)]
    gate, up = [p[0] for p in pairs], [p[1] for p in pairs]
    g_raw, u_raw = (np.concatenate([p[i] for p in pairs]) for i in (3, 4))
    d_raws = [_raw(rng, d, n_ff, td) for _ in range(ne)]
    down = [_m(r, td, d, n_ff) for r in d_raws]
    router = _m(_raw(rng, ne, d, T.F32, 1.0), T.F32, ne, d)
    x_down = _experts([np.concatenate(d_raws)], td, d, ne, n_ff)
    if tg == tu:  # [gate | up] per expert
        moe = MoE(cfg, router, _experts([g_raw, u_raw], tg, n_ff, ne, d), None, None, x_down)
    else:
        moe = MoE(
            cfg, router, None, _experts([g_raw], tg, n_ff, ne, d), _experts([u_raw], tu, n_ff, ne, d), x_down
        )
    sh = sh_gate = None
    if shared:
        sg, su, sboth, _, _ = _pair(rng, N_FF_SHARED, T.Q8_0, T.Q8_0, d)
        sd = _m(_raw(rng, d, N_FF_SHARED, T.Q8_0), T.Q8_0, d, N_FF_SHARED)
        sh_gate = _m(_raw(rng, 1, d, T.F32), T.F32, 1, d)
        moe.shared, moe.shared_down, moe.shared_gate = sboth, sd, sh_gate
        sh = (sg, su, sd)

    def reference(x: np.ndarray) -> np.ndarray:
        return layers_ref.moe_ffn(
            x,
            router,
            gate,
            up,
            down,
            cfg.n_expert_used,
            cfg.gating,
            cfg.norm_weights,
            cfg.weights_scale,
            sh,
            sh_gate,
            moe.router_bias,
            None if moe.gate_bias is None else (moe.gate_bias, moe.up_bias, moe.down_bias),
            cfg.activation == "swiglu_oai",
        )

    return moe, reference


def _run(moe: MoE, x: np.ndarray) -> np.ndarray:
    n, d = x.shape
    ws = Workspace(n, d, d, d, 0, 8, False, False)
    ws.moe = moe.buffers(n, d)
    ws.h.rows(n)[:] = x
    moe.forward(None, 0, ws, n)  # type: ignore[arg-type]  # the model is only read for LoRA and imatrix
    return ws.o[:n].copy()


@pytest.mark.parametrize(
    ("types", "shared", "cfg"),
    [
        ((T.Q8_0, T.Q8_0, T.Q8_0), False, MoEConfig(8, 2, Gating.SOFTMAX, True)),  # qwen3moe's
        ((T.Q4_0, T.Q4_0, T.F16), True, MoEConfig(8, 4, Gating.SOFTMAX, False)),  # qwen2moe's, shared
        ((T.Q8_0, T.Q4_0, T.F32), False, MoEConfig(6, 3, Gating.SIGMOID, True, 2.5)),  # gate and up apart
        ((T.Q4_K, T.Q4_K, T.Q6_K), False, MoEConfig(8, 4, Gating.SOFTMAX, True)),  # Q4_K_M: grouped kernels
        (
            (T.Q4_K, T.Q6_K, T.Q4_K),
            True,
            MoEConfig(8, 2, Gating.SOFTMAX, False),
        ),  # grouped, gate and up apart
    ],
)
def test_moe_layer_matches_reference(types: tuple[T, T, T], shared: bool, cfg: MoEConfig) -> None:
    k_types = T.Q4_K in types
    d, n_ff = (256, 256) if k_types else (N_EMBD, N_FF)  # the K types' rows are 256 values
    moe, reference = _layer_and_reference(1, types, shared, cfg, d, n_ff)
    x = np.random.default_rng(2).standard_normal((11, d)).astype(np.float32)
    got = _run(moe, x)
    np.testing.assert_array_equal(got, reference(x))
    # one token alone gives its row of the batch: the grouping changes no number
    np.testing.assert_array_equal(_run(moe, x[5:6])[0], got[5])
    assert np.isfinite(got).all() and got.std() > 0


def test_a_batch_runs_one_product_per_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    """All the chosen experts of a step go in one grouped product per weight (gate and up stacked, down),
    each expert's tiles read once for all its tokens."""
    cfg = MoEConfig(8, 2, Gating.SOFTMAX, True)
    moe, _ = _layer_and_reference(3, (T.Q4_K, T.Q4_K, T.Q4_K), False, cfg, 256, 256)
    calls: list[tuple[int, int]] = []
    real = ExpertMatrix.matmul

    def counted(self, acts, out, pairs, offsets, active, m, div, scratch=None):  # type: ignore[no-untyped-def]
        calls.append((self.rows, m))
        assert sorted(active[:m].tolist()) == active[:m].tolist()  # each active expert once
        return real(self, acts, out, pairs, offsets, active, m, div, scratch)

    monkeypatch.setattr(ExpertMatrix, "matmul", counted)
    _run(moe, np.random.default_rng(4).standard_normal((16, 256)).astype(np.float32))
    assert [rows for rows, _ in calls] == [512, 256] and calls[0][1] > 2


def test_swiglu_oai_matches_reference_past_the_limit() -> None:
    """ggml_swiglu_oai: the gate clamped above only, the up value on both sides, at 7."""
    from llama_engine.layers.moe import OAI_ALPHA, OAI_LIMIT, swiglu_oai

    rng = np.random.default_rng(5)
    gu = (rng.standard_normal((3, 2 * 40)) * 6).astype(np.float32)  # many values beyond +-7
    gu[0, :4] = [np.float32(7.0), np.float32(-7.0), np.float32(100.0), np.float32(-100.0)]
    out = np.empty((3, 40), np.float32)
    swiglu_oai(out, gu, gu, 3, 40, 0, 40, np.float32(OAI_ALPHA), np.float32(OAI_LIMIT))
    want = layers_ref.swiglu_oai(gu[:, :40], gu[:, 40:], OAI_ALPHA, OAI_LIMIT)
    np.testing.assert_array_equal(out, want)
    assert (np.abs(gu) > 7).any() and np.isfinite(out).all()


@pytest.mark.parametrize("types", [(T.MXFP4, T.MXFP4, T.MXFP4), (T.Q8_0, T.F16, T.Q8_0)])
def test_gpt_oss_experts_with_biases_match_reference(types: tuple[T, T, T]) -> None:
    """gpt-oss's layer: the router's bias, a softmax over the chosen logits, per-expert gate, up and down
    biases (ggml_add_id) and swiglu_oai; MXFP4 experts (gate and up stacked) or gate and up apart."""
    cfg = MoEConfig(8, 4, Gating.SOFTMAX_WEIGHT, activation="swiglu_oai")
    moe, reference = _layer_and_reference(6, types, False, cfg)
    rng = np.random.default_rng(7)
    moe.router_bias = rng.standard_normal(8).astype(np.float32)
    moe.gate_bias, moe.up_bias = (rng.standard_normal((8, N_FF)).astype(np.float32) for _ in "gu")
    moe.down_bias = rng.standard_normal((8, N_EMBD)).astype(np.float32)
    x = (rng.standard_normal((9, N_EMBD)) * 3).astype(np.float32)
    got = _run(moe, x)
    np.testing.assert_array_equal(got, reference(x))
    np.testing.assert_array_equal(_run(moe, x[4:5])[0], got[4])
    assert np.isfinite(got).all() and got.std() > 0
