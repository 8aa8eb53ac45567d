"""LoRA adapters in the engine on a tiny model: per-request scales, never batching different adapter sets,
batching the same set, the prefix cache kept apart per set, and adapters that cannot be used."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from lora_adapters import write_lora
from tiny_models import write_tiny_model

from gguf_io import GGUFValueType, GGUFWriter
from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams, TokenEvent
from llama_engine.lora import LoraError, load_lora

PROMPT = [256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]
N = 16


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("lora")
    model = write_tiny_model(tmp / "m.gguf", "llama", seed=4)
    return (
        model,
        write_lora(tmp / "a.gguf", model, seed=1, scale=0.3),
        write_lora(tmp / "b.gguf", model, seed=2, scale=0.3),
    )


@pytest.fixture(scope="module")
def engine(files):
    model, a, b = files
    e = Engine(model, EngineConfig(n_ctx=512, n_parallel=2, lora=(str(a), str(b)))).start()
    yield e
    e.shutdown()


def _run(engine: Engine, lora: tuple[float, ...], cache_prompt: bool = True) -> list[int]:
    req = GenerationRequest(
        prompt=PROMPT,
        max_tokens=N,
        lora=lora,
        sampling=SamplingParams(temperature=0.0),
        cache_prompt=cache_prompt,
    )
    return [ev.token for ev in engine.submit(req) if isinstance(ev, TokenEvent)]


def _together(engine: Engine, loras: list[tuple[float, ...]]) -> tuple[list[list[int]], int]:
    out: list[list[int]] = [[] for _ in loras]
    steps = engine.steps
    threads = [
        threading.Thread(target=lambda i=i, lo=lo: out.__setitem__(i, _run(engine, lo)))
        for i, lo in enumerate(loras)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, engine.steps - steps


def test_each_request_gets_its_own_adapter(engine: Engine) -> None:
    plain, with_a, with_b = _run(engine, ()), _run(engine, (1.0,)), _run(engine, (0.0, 1.0))
    assert len({tuple(plain), tuple(with_a), tuple(with_b)}) == 3
    assert _run(engine, (0.0, 0.0)) == plain  # scale 0 is no adapter
    (a, b), steps = _together(engine, [(1.0,), (0.0, 1.0)])
    assert a == with_a and b == with_b
    assert steps >= 2 * N  # never in one batch: each set takes its own steps


def test_the_same_adapter_set_is_batched(engine: Engine) -> None:
    alone = _run(engine, (0.5, 0.5))
    (x, y), steps = _together(engine, [(0.5, 0.5), (0.5, 0.5)])
    assert x == alone and y == alone
    assert steps < 2 * N


def test_a_cached_prefix_is_not_reused_under_other_adapters(engine: Engine) -> None:
    fresh = _run(engine, (1.0,), cache_prompt=False)
    _run(engine, ())  # leaves the prompt cached under no adapter
    assert _run(engine, (1.0,)) == fresh


def test_scales_for_more_adapters_than_loaded(engine: Engine) -> None:
    with pytest.raises(ValueError, match="LoRA scales"):
        engine.submit(GenerationRequest(prompt=PROMPT, max_tokens=1, lora=(1.0, 1.0, 1.0)))


def test_adapters_that_cannot_be_used(tmp_path: Path, files, engine: Engine) -> None:
    model, a, _ = files
    m = engine.model
    with pytest.raises(LoraError, match="not a LoRA adapter"):
        load_lora(model, m)
    other = write_tiny_model(tmp_path / "q.gguf", "qwen3", seed=1)
    with pytest.raises(LoraError, match="architecture"):
        load_lora(write_lora(tmp_path / "q-lora.gguf", other), m)
    w = GGUFWriter(tmp_path / "embd.gguf")
    for k, v in {"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora"}.items():
        w.add_metadata(k, v)
    w.add_metadata("adapter.lora.alpha", 8.0, GGUFValueType.FLOAT32)
    w.add_tensor("token_embd.weight.lora_a", [2, 4], 0, np.zeros((4, 2), np.float32))
    w.add_tensor("token_embd.weight.lora_b", [4, 2], 0, np.zeros((2, 4), np.float32))
    w.finish()
    with pytest.raises(LoraError, match="not supported"):
        load_lora(tmp_path / "embd.gguf", m)
    assert len(load_lora(a, m).weights) == 7 * 7
