"""Per-tensor type rules of llama.cpp's quantizer: which tensors are quantized, and to what.

A port of ``src/llama-quant.cpp``: ``tensor_allows_quantization``, ``tensor_get_category``,
``llama_tensor_get_type`` / ``llama_tensor_get_type_impl`` (the k-quant mixtures), ``tensor_type_fallback``
(rows whose length is not a multiple of the block size), ``tensor_requires_imatrix`` and
``llama_ftype_get_default_type``. The rules depend on the order tensors are visited (attention-v and
ffn counters), which is llama.cpp's ``weights_map`` order: :func:`weight_order`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from llama_quant.filetypes import (
    FILE_TYPES,
    F,
    FileType,
    default_type,
    parse_file_type,
    parse_ggml_type,
)

__all__ = [
    "FILE_TYPES",
    "FileType",
    "MixtureParams",
    "ModelInfo",
    "Plan",
    "TensorSpec",
    "allows_quantization",
    "default_type",
    "parse_file_type",
    "parse_ggml_type",
    "plan_types",
    "tensor_requires_imatrix",
    "weight_order",
]


_FLOAT_TYPES = (T.F32, T.F16, T.BF16)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """The hyperparameters the mixture rules read (llama_hparams)."""

    arch: str
    n_layer: int
    n_head: int = 0
    n_head_kv: int = 0
    n_expert: int = 0
    is_70b: bool = False  # llama.cpp's LLM_TYPE_70B (80-layer llama with GQA, qwen2/deci/olmo 80, jais2 68)

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @classmethod
    def from_metadata(cls, md: dict) -> ModelInfo:
        """Read ``general.architecture`` and ``{arch}.block_count`` / head counts / ``expert_count``."""
        arch = str(md.get("general.architecture", ""))

        def first(key: str, default: int) -> int:
            v = md.get(f"{arch}.{key}", default)
            if isinstance(v, list):
                v = v[0] if v else default
            return int(v)

        n_layer = first("block_count", 0)
        n_head = first("attention.head_count", 0)
        n_head_kv = first("attention.head_count_kv", n_head)
        is_70b = (arch == "llama" and n_layer == 80 and n_head != n_head_kv) or (
            (arch in ("qwen2", "deci", "olmo") and n_layer == 80) or (arch == "jais2" and n_layer == 68)
        )
        return cls(arch, n_layer, n_head, n_head_kv, first("expert_count", 0), is_70b)


@dataclass(slots=True)
class MixtureParams:
    """The llama_model_quantize_params fields that choose tensor types."""

    ftype: int
    output_tensor_type: T | None = None
    token_embedding_type: T | None = None
    quantize_output_tensor: bool = True
    only_copy: bool = False
    pure: bool = False
    has_imatrix: bool = False
    # --tensor-type: (lower-cased regex, type), first match wins (std::regex_search)
    tensor_types: list[tuple[str, T]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A tensor as the rules see it: name, ggml-order shape (ne0 = row length first) and current type."""

    name: str
    shape: tuple[int, ...]
    ggml_type: T

    @property
    def n_dims(self) -> int:
        """``ggml_n_dims``: trailing dimensions of size 1 do not count."""
        n = len(self.shape)
        while n > 1 and self.shape[n - 1] == 1:
            n -= 1
        return n

    def ne(self, i: int) -> int:
        return self.shape[i] if i < len(self.shape) else 1


def _layer_of(name: str) -> int:
    m = re.match(r"blk\.([+-]?\d+)", name)  # sscanf(name, "blk.%d.", ...)
    return int(m.group(1)) if m else -1


def weight_order(names: Sequence[str]) -> list[str]:
    """llama_model_loader's weights_map order: by layer (non-layer tensors first), then by name (bytes)."""
    return sorted(names, key=lambda n: (_layer_of(n), n.encode("utf-8")))


class _Cat(enum.Enum):
    TOKEN_EMBD = 0
    ATTN_Q = 1
    ATTN_V = 2
    ATTN_K = 3
    ATTN_QKV = 4
    ATTN_KV_B = 5
    ATTN_OUTPUT = 6
    FFN_UP = 7
    FFN_GATE = 8
    FFN_DOWN = 9
    OUTPUT = 10
    OTHER = 11


def _is_token_embd(name: str) -> bool:
    return name in ("token_embd.weight", "per_layer_token_embd.weight")


def _category(name: str) -> _Cat:
    if name == "output.weight":
        return _Cat.OUTPUT
    if _is_token_embd(name):
        return _Cat.TOKEN_EMBD
    for part, cat in (
        ("attn_qkv.weight", _Cat.ATTN_QKV),
        ("attn_kv_b.weight", _Cat.ATTN_KV_B),
        ("attn_v.weight", _Cat.ATTN_V),
        ("attn_k.weight", _Cat.ATTN_K),
        ("attn_q.weight", _Cat.ATTN_Q),
        ("attn_output.weight", _Cat.ATTN_OUTPUT),
        ("ffn_up", _Cat.FFN_UP),
        ("ffn_gate", _Cat.FFN_GATE),
        ("ffn_down", _Cat.FFN_DOWN),
    ):
        if part in name:
            return cat
    return _Cat.OTHER


_ATTN_V_CATS = (_Cat.ATTN_V, _Cat.ATTN_QKV, _Cat.ATTN_KV_B)

# substrings that keep a tensor unquantized (tensor_allows_quantization)
_NEVER = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos",
    ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)  # fmt: skip
_NEVER_GLM5_NEXT = (
    "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight",
    "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight",
)  # fmt: skip


def allows_quantization(t: TensorSpec, arch: str, params: MixtureParams) -> bool:
    """``tensor_allows_quantization``: 2-D/3-D ``*weight`` tensors except norms, routers, tiny tables."""
    if params.only_copy or t.n_dims < 2:
        return False
    name = t.name
    if not name.endswith("weight"):
        return False
    if not params.quantize_output_tensor and name == "output.weight":
        return False
    if any(s in name for s in _NEVER):
        return False
    if arch == "glm5-next" and any(s in name for s in _NEVER_GLM5_NEXT):
        return False
    # positional embeddings and token types (BERT): LLM_TN(arch)(POS_EMBD / TOKEN_TYPES, "weight")
    return name not in ("position_embd.weight", "token_types.weight")


def tensor_requires_imatrix(name: str, dst: T, ftype: int) -> bool:
    """``tensor_requires_imatrix``: the very low-bit types that give garbage without one."""
    if _is_token_embd(name) or name == "output.weight":
        return False
    if dst in (T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_M, T.IQ1_S):
        return True
    return dst == T.Q2_K and ftype == F.Q2_K_S


def _blck(t: T) -> int:
    return GGML_QUANT_SIZES[t][0]


def _is_quantized(t: T) -> bool:
    return t not in _FLOAT_TYPES and t not in (T.I8, T.I16, T.I32, T.I64, T.F64)


_FALLBACK = {
    T.IQ1_S: T.IQ4_NL, T.IQ1_M: T.IQ4_NL, T.IQ2_XXS: T.IQ4_NL, T.IQ2_XS: T.IQ4_NL, T.IQ2_S: T.IQ4_NL,
    T.IQ3_XXS: T.IQ4_NL, T.IQ3_S: T.IQ4_NL, T.IQ4_XS: T.IQ4_NL,
    T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.TQ1_0: T.Q4_0, T.TQ2_0: T.Q4_0,
    T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0,
}  # fmt: skip
if hasattr(T, "Q2_0"):
    _FALLBACK[T.Q2_0] = T.Q4_0


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    # C++ integer division; the third term is only reached with i_layer >= n_layers/8 (non-negative)
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


@dataclass
class _State:
    """quantize_state_impl: counters advanced as tensors are visited in weight order."""

    model: ModelInfo
    params: MixtureParams
    patterns: list[tuple[re.Pattern[str], T]]
    n_attention_wv: int = 0
    n_ffn: int = 0
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0
    n_fallback: int = 0
    has_tied_embeddings: bool = True
    fallbacks: list[str] = field(default_factory=list)

    def layer_info(self, i_layer: int, name: str) -> tuple[int, int]:
        n_layer = self.n_ffn
        if max(1, self.model.n_expert) > 1:
            m = re.match(r"blk\.([+-]?\d+)\.", name)
            if m is None:
                raise ValueError(f"Failed to determine layer for tensor {name}")
            i_layer = int(m.group(1))
            if not 0 <= i_layer < n_layer:
                raise ValueError(f"Bad layer {i_layer} for tensor {name}. Must be in [0, {n_layer})")
        return i_layer, n_layer


def _fallback(qs: _State, t: TensorSpec, target: T) -> T:
    """``tensor_type_fallback``: a type whose block fits the row length (finally F16)."""
    ncols = t.ne(0)
    qk = _blck(target)
    if ncols % qk == 0:
        return target
    qs.n_fallback += 1
    if target in _FALLBACK:
        ret = _FALLBACK[target]
    elif qk <= 32:
        ret = target
    else:
        raise ValueError(f"no tensor type fallback is defined for type {target.name}")
    if ncols % _blck(ret):
        ret = T.F16
    qs.fallbacks.append(f"{t.name}: ncols {ncols} not divisible by {qk} ({target.name}) -> {ret.name}")
    return ret


def _get_type_impl(qs: _State, new_type: T, t: TensorSpec, ftype: int, cat: _Cat) -> T:
    """``llama_tensor_get_type_impl``: the mixture rules of the k-quant and i-quant file types."""
    name, arch, hp, params = t.name, qs.model.arch, qs.model, qs.params
    n_expert = hp.n_expert
    gqa = hp.n_gqa
    low_iq = (F.IQ2_XXS, F.IQ2_XS, F.IQ1_S, F.IQ2_S, F.IQ2_M, F.IQ1_M)

    glm5_keep = ("attn_q_a", "attn_q_b", "nextn.eh_proj")
    if arch == "glm5-next" and any(s in name for s in glm5_keep) and new_type not in _FLOAT_TYPES:
        return T.Q8_0

    if cat == _Cat.OUTPUT or (qs.has_tied_embeddings and cat == _Cat.TOKEN_EMBD):
        if params.output_tensor_type is not None:
            return params.output_tensor_type
        nx = t.ne(0)
        if ftype == F.MXFP4_MOE or arch == "falcon" or nx % _blck(new_type):
            return T.Q8_0
        if ftype in (F.IQ2_XXS, F.IQ2_XS, F.IQ3_XXS, F.IQ1_S, F.IQ2_S, F.IQ2_M, F.IQ1_M):
            return T.Q5_K
        return new_type if new_type == T.Q8_0 else T.Q6_K
    if ftype == F.MXFP4_MOE:
        is_expert_role = cat in (_Cat.FFN_UP, _Cat.FFN_GATE, _Cat.FFN_DOWN)
        if t.ne(2) > 1 and (arch != "bailingmoe3" or is_expert_role):
            return T.MXFP4
        return T.Q8_0
    if cat == _Cat.TOKEN_EMBD:
        if params.token_embedding_type is not None:
            return params.token_embedding_type
        if ftype in (F.IQ2_XXS, F.IQ2_XS, F.IQ1_S, F.IQ1_M):
            return T.Q2_K
        if ftype in (F.IQ2_S, F.IQ2_M, F.IQ3_XXS):
            return T.IQ3_S
        if ftype in (F.TQ1_0, F.TQ2_0, F.Q2_0):
            return T.Q4_K
        return new_type
    if ftype in low_iq:
        iq2sm = ftype in (F.IQ2_S, F.IQ2_M)
        if cat in _ATTN_V_CATS:
            if gqa >= 4 or n_expert >= 4:
                new_type = T.Q4_K
            else:
                new_type = T.IQ3_S if iq2sm else T.Q2_K
            qs.i_attention_wv += 1
        elif n_expert == 8 and cat == _Cat.ATTN_K:
            new_type = T.Q4_K
        elif cat == _Cat.FFN_DOWN:
            if qs.i_ffn_down < qs.n_ffn // 8:
                new_type = T.IQ3_S if iq2sm else T.Q2_K
            qs.i_ffn_down += 1
        elif cat == _Cat.ATTN_OUTPUT:
            if n_expert == 8:
                new_type = T.Q5_K
            elif ftype in (F.IQ1_S, F.IQ1_M):
                new_type = T.IQ2_XXS
            elif iq2sm:
                new_type = T.IQ3_S
        return new_type
    if cat in _ATTN_V_CATS:
        if ftype == F.Q2_K:
            new_type = T.Q4_K if gqa >= 4 else T.Q3_K
        elif ftype == F.Q2_K_S and gqa >= 4:
            new_type = T.Q4_K
        elif ftype == F.IQ3_XXS:
            new_type = T.Q4_K if gqa >= 4 else (T.IQ3_S if not params.has_imatrix else T.IQ3_XXS)
        elif (ftype in (F.IQ3_XS, F.IQ3_S) and gqa >= 4) or ftype == F.IQ3_M:
            new_type = T.Q4_K
        elif ftype == F.Q3_K_M:
            new_type = T.Q5_K if qs.i_attention_wv < 2 else T.Q4_K
        elif ftype == F.Q3_K_L or (ftype in (F.IQ4_NL, F.IQ4_XS) and gqa >= 4):
            new_type = T.Q5_K
        elif ftype in (F.Q4_K_M, F.Q5_K_M) and _use_more_bits(qs.i_attention_wv, qs.n_attention_wv):
            new_type = T.Q6_K
        elif ftype == F.Q4_K_S and qs.i_attention_wv < 4:
            new_type = T.Q5_K
        if hp.is_70b and new_type in (T.Q3_K, T.Q4_K):
            new_type = T.Q5_K
        if n_expert == 8:
            new_type = T.Q8_0
        qs.i_attention_wv += 1
    elif cat == _Cat.ATTN_K:
        if n_expert == 8:
            new_type = T.Q8_0
        elif ftype == F.IQ3_XS:
            new_type = T.IQ3_XXS
        elif ftype == F.IQ3_XXS:
            new_type = T.IQ2_S
    elif cat == _Cat.ATTN_Q:
        if ftype == F.IQ3_XS:
            new_type = T.IQ3_XXS
        elif ftype == F.IQ3_XXS:
            new_type = T.IQ2_S
    elif cat == _Cat.FFN_DOWN:
        new_type = _ffn_down_type(qs, new_type, name, ftype)
        qs.i_ffn_down += 1
    elif cat == _Cat.ATTN_OUTPUT:
        if arch != "falcon":
            if n_expert == 8:
                if ftype in (
                    F.Q2_K, F.IQ3_XS, F.IQ3_XXS, F.Q3_K_S, F.Q3_K_M, F.IQ4_NL, F.Q4_K_S, F.Q4_K_M,
                    F.IQ3_S, F.IQ3_M, F.IQ4_XS,
                ):  # fmt: skip
                    new_type = T.Q5_K
            else:
                attn_out: dict[int, T] = {
                    F.Q2_K: T.Q3_K, F.IQ3_XXS: T.IQ3_S, F.Q3_K_M: T.Q4_K, F.Q3_K_L: T.Q5_K, F.IQ3_M: T.Q4_K,
                }  # fmt: skip
                new_type = attn_out.get(ftype, new_type)
        elif ftype == F.Q3_K_L:
            new_type = T.Q4_K
    elif cat == _Cat.ATTN_QKV:
        if ftype in (F.Q3_K_M, F.Q3_K_L, F.IQ3_M):
            new_type = T.Q4_K
        elif ftype == F.Q4_K_M:
            new_type = T.Q5_K
        elif ftype == F.Q5_K_M:
            new_type = T.Q6_K
    elif cat in (_Cat.FFN_GATE, _Cat.FFN_UP):
        counter = qs.i_ffn_gate if cat == _Cat.FFN_GATE else qs.i_ffn_up
        i_layer, n_layer = qs.layer_info(counter, name)
        if ftype == F.IQ3_XS and n_layer // 8 <= i_layer < 7 * n_layer // 8:
            new_type = T.IQ3_XXS
        if cat == _Cat.FFN_GATE:
            qs.i_ffn_gate += 1
        else:
            qs.i_ffn_up += 1
    return new_type


def _ffn_down_type(qs: _State, new_type: T, name: str, ftype: int) -> T:
    i_layer, n_layer = qs.layer_info(qs.i_ffn_down, name)
    arch, n_expert, imat = qs.model.arch, qs.model.n_expert, qs.params.has_imatrix
    if ftype == F.Q2_K:
        return T.Q3_K
    if ftype == F.Q2_K_S:
        return T.Q4_K if i_layer < n_layer // 8 else new_type
    if ftype == F.IQ3_XXS and not imat:
        return T.Q4_K if i_layer < n_layer // 8 else T.Q3_K
    if ftype == F.Q3_K_M:
        if i_layer < n_layer // 16:
            return T.Q5_K
        return T.Q4_K if arch != "falcon" or _use_more_bits(i_layer, n_layer) else T.Q3_K
    if ftype == F.IQ3_M and (i_layer < n_layer // 8 or (n_expert == 8 and _use_more_bits(i_layer, n_layer))):
        return T.Q4_K
    if ftype == F.Q3_K_L:
        return T.Q4_K if arch == "falcon" else T.Q5_K
    if ftype == F.Q4_K_M:
        if arch == "falcon":
            if i_layer < n_layer // 16:
                return T.Q6_K
            return T.Q5_K if _use_more_bits(i_layer, n_layer) else T.Q4_K
        return T.Q6_K if _use_more_bits(i_layer, n_layer) else new_type
    if i_layer < n_layer // 8 and ftype in (F.IQ4_NL, F.IQ4_XS) and not imat:
        return T.Q5_K
    if ftype == F.Q5_K_M and _use_more_bits(i_layer, n_layer):
        return T.Q6_K
    if ftype == F.Q4_K_S and arch != "falcon" and i_layer < n_layer // 8:
        return T.Q5_K
    if ftype in (F.Q4_0, F.Q5_0) and imat and i_layer < n_layer // 8:
        return T.Q4_1 if ftype == F.Q4_0 else T.Q5_1
    return new_type


def _get_type(qs: _State, t: TensorSpec, default: T, cat: _Cat) -> T:
    """``llama_tensor_get_type``: explicit types first, then --tensor-type, the mixture and the fallback."""
    params = qs.params
    if params.token_embedding_type is not None and cat == _Cat.TOKEN_EMBD:
        named = t.name == "per_layer_token_embd.weight" and any(p.search(t.name) for p, _ in qs.patterns)
        if not named:
            return params.token_embedding_type
    if params.output_tensor_type is not None and cat == _Cat.OUTPUT:
        return params.output_tensor_type
    new_type = default
    if _is_quantized(default):
        manual = False
        for pattern, qtype in qs.patterns:
            if pattern.search(t.name):
                new_type = qtype
                manual = True
                break
        if not manual and not params.pure:
            new_type = _get_type_impl(qs, new_type, t, params.ftype, cat)
        new_type = _fallback(qs, t, new_type)
    return new_type


@dataclass(frozen=True, slots=True)
class Plan:
    """The type chosen for every tensor (weight order), and the fallback notes."""

    types: dict[str, T]
    quantized: frozenset[str]  # tensors the rules were allowed to change
    fallbacks: tuple[str, ...]


def plan_types(tensors: Sequence[TensorSpec], model: ModelInfo, params: MixtureParams) -> Plan:
    """The target type of each tensor, as llama.cpp's preliminary pass computes it.

    ``tensors`` must be in :func:`weight_order`: the counters of the mixture rules depend on it.
    """
    default = default_type(params.ftype)
    if default is None:
        raise ValueError(f"invalid output file type {params.ftype}")
    patterns = [(re.compile(p), q) for p, q in params.tensor_types]
    qs = _State(model, params, patterns, n_ffn=model.n_layer)
    cats = {t.name: _category(t.name) for t in tensors}
    for c in cats.values():
        if c in _ATTN_V_CATS:
            qs.n_attention_wv += 1
        if c == _Cat.OUTPUT:
            qs.has_tied_embeddings = False
    types: dict[str, T] = {}
    allowed: set[str] = set()
    for t in tensors:
        if allows_quantization(t, model.arch, params):
            allowed.add(t.name)
            types[t.name] = _get_type(qs, t, default, cats[t.name])
        else:
            types[t.name] = t.ggml_type
    return Plan(types, frozenset(allowed), tuple(qs.fallbacks))
