"""The embedding pooling in use: `--pooling` when given, else the model's own (llama.cpp's rule).

llama.cpp reads `<arch>.pooling_type` from the GGUF (0 none, 1 mean, 2 cls, 3 last, 4 rank); a model
without the key pools nothing (`none`: `/embedding` returns one vector per token and `/v1/embeddings`
refuses, as llama-server does for a chat model such as SmolLM2). `config.pooling` stays None unless the
flag is given, so `/rerank` still needs `--reranking` (or `--pooling rank`) explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llama_engine import Pooling

from .state import ServerState

__all__ = ["model_pooling", "server_pooling"]

_BY_VALUE = {p.value: p for p in Pooling}


def model_pooling(metadata: Mapping[str, Any], arch: str) -> Pooling:
    """The model's `<arch>.pooling_type` (NONE when absent or unknown)."""
    value = metadata.get(f"{arch}.pooling_type")
    return _BY_VALUE.get(value, Pooling.NONE) if isinstance(value, int) else Pooling.NONE


def server_pooling(st: ServerState) -> Pooling:
    """`--pooling`, else the loaded model's pooling type."""
    if st.config.pooling:
        return Pooling[st.config.pooling.upper()]
    gguf = st.require_engine().gguf
    return model_pooling(gguf.metadata, gguf.header.architecture)
