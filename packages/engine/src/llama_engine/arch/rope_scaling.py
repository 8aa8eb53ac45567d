"""RoPE scaling from the model's metadata, as llama.cpp resolves it (llama-model.cpp load_hparams and the
llama_context constructor): linear frequency scaling, YaRN, and per-dimension frequency factors.

`<arch>.rope.scaling.type` (none, linear, yarn, longrope; default linear), `.factor` (freq_scale = 1/factor; the legacy
`rope.scale_linear` too), `.original_context_length` (YaRN's n_ctx_orig, default the training context),
`.yarn_ext_factor` (unset: 1 for yarn, else 0), `.yarn_attn_factor`, `.yarn_beta_fast`, `.yarn_beta_slow`,
`.yarn_log_multiplier`, `.attn_factor`. llama-server's `--rope-scaling`, `--rope-scale`, `--rope-freq-scale`,
`--yarn-*` flags reach the engine as these keys (the flag replaces the model's value, as llama.cpp's context
parameters do). With YaRN on, the magnitude factor is llama.cpp's get_mscale(1/freq_scale), divided by the
1 + 0.1 ln(1/freq_scale) that ggml's rope_yarn multiplies back in.

Frequency factors (llama_model::get_rope_factors) divide each dimension's angle: `rope_freqs.weight`
(Llama 3.1's) when the file has it, else Phi-3's longrope pair, `rope_factors_long.weight` when a
sequence's context (n_ctx_seq) exceeds the original context length and `rope_factors_short.weight`
otherwise. longrope itself scales like linear (no YaRN ramp unless `yarn_ext_factor` says so); its
magnitude comes from `.attn_factor`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ops.rope import logf, yarn_corr_dims

__all__ = ["FREQ_FACTOR_TENSORS", "RopeScaling", "freq_factors", "rope_scaling"]

# (rope_freqs, long, short): the tensors of ggml_rope_ext's frequency factors
FREQ_FACTOR_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """What ggml_rope_ext receives besides the base: freq_scale, ext_factor, attn_factor (mscale), and
    what the correction dims are computed from."""

    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0

    def table_args(self, n_dims: int, freq_base: float) -> dict[str, Any]:
        """Keyword arguments of `ops.rope_cache` for one base frequency."""
        dims = yarn_corr_dims(n_dims, self.n_ctx_orig, freq_base, self.beta_fast, self.beta_slow)
        return {
            "freq_scale": self.freq_scale,
            "ext_factor": self.ext_factor,
            "attn_factor": self.attn_factor,
            "corr_dims": dims,
        }


def _f32(x: Any) -> np.float32:
    return np.float32(float(x))


def _mscale(scale: np.float32, mscale: np.float32) -> np.float32:
    one = np.float32(1.0)
    return one if scale <= one else np.float32(0.1) * mscale * logf(scale) + one


def rope_scaling(metadata: Mapping[str, Any], arch: str, n_ctx_train: int) -> RopeScaling:
    """The model's RoPE scaling (float32 arithmetic as llama.cpp's)."""

    def get(key: str, default: Any) -> Any:
        value = metadata.get(f"{arch}.rope.{key}")
        return default if value is None else value

    kind = str(get("scaling.type", "linear"))
    if kind not in ("none", "linear", "yarn", "longrope"):
        raise ValueError(f"unsupported RoPE scaling type {kind!r} (none, linear, yarn, longrope)")
    factor = _f32(get("scaling.factor", get("scale_linear", 0.0)))
    freq_scale = np.float32(1.0) if factor == 0 else np.float32(1.0) / factor
    if kind == "none":
        freq_scale = np.float32(1.0)
    ext = _f32(get("scaling.yarn_ext_factor", -1.0))
    if ext < 0:
        ext = np.float32(1.0 if kind == "yarn" else 0.0)
    attn = _f32(get("scaling.yarn_attn_factor", 1.0))
    if ext != 0:
        f = np.float32(1.0) / freq_scale
        log_mul = _f32(get("scaling.yarn_log_multiplier", 0.0))
        if log_mul != 0:
            attn = _mscale(f, np.float32(1.0)) / _mscale(f, log_mul)
        else:
            attn = _mscale(f, np.float32(1.0))
        attn = attn * (np.float32(1.0) / (np.float32(1.0) + np.float32(0.1) * logf(f)))
    attn = attn * _f32(get("scaling.attn_factor", 1.0))
    n_orig = int(get("scaling.original_context_length", 0)) or n_ctx_train
    return RopeScaling(
        float(freq_scale),
        float(ext),
        float(attn),
        float(_f32(get("scaling.yarn_beta_fast", 32.0))),
        float(_f32(get("scaling.yarn_beta_slow", 1.0))),
        n_orig,
    )


def freq_factors(tensors: Mapping[str, np.ndarray], n_ctx_seq: int, n_ctx_orig: int) -> np.ndarray | None:
    """The frequency factors a layer's RoPE uses (float32 [n_rot/2]), or None (llama.cpp's choice)."""
    freqs, long, short = (tensors.get(name) for name in FREQ_FACTOR_TENSORS)
    if freqs is not None:
        return freqs
    return long if n_ctx_seq > n_ctx_orig else short
