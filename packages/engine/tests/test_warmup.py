"""The first-start warm-up: after one warm-up, a new process loads every kernel a default request runs from
numba's cache, compiles nothing, starts no compiling process, and its first request compiles nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tiny_models import write_tiny_model

from llama_engine import Engine, EngineConfig
from llama_engine.warmup import warm_up


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", "llama", seed=3)


_SECOND_START = textwrap.dedent(
    """
    import json, sys
    from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams
    from llama_engine.warmup import warm_up
    from llama_quant.compiling import CompileWatch

    engine = Engine(sys.argv[1], EngineConfig(n_ctx=256, warmup=False))
    lines = []
    with CompileWatch() as watch:
        n = warm_up(engine, report=lines.append)
    engine.start()
    with CompileWatch() as first_request:
        handle = engine.submit(GenerationRequest(prompt=[1, 2, 3], max_tokens=4, sampling=SamplingParams()))
        events = list(handle)
    engine.shutdown()
    print(json.dumps({"n": n, "lines": lines, "warm_up": watch.compiled, "request": first_request.compiled,
                      "events": len(events)}))
    """
)


def test_a_second_start_loads_everything(tiny_path: Path) -> None:
    # compiles (in child processes) whatever the cache lacks for this model's types
    warm_up(Engine(tiny_path, EngineConfig(n_ctx=256, warmup=False)), report=lambda _: None)
    done = subprocess.run(
        [sys.executable, "-c", _SECOND_START, str(tiny_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["n"] == 0
    assert got["lines"] == []  # no progress lines: no compiling processes were started
    assert got["warm_up"] == []
    assert got["request"] == []  # the first request runs on what the warm-up loaded
    assert got["events"] == 5  # 4 tokens and the final event
