"""LoRA adapters against a real server on SmolLM2 with two adapters written with gguf-io: GET/POST
/lora-adapters, the per-request `lora` field, global scales, and concurrent requests under different
adapters each getting their own output."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from pathlib import Path

import click
import httpx
import pytest
from conftest import assert_error, smollm2_path, start_server, stop_server

from llama_server.lora import lora_from_flags

ENGINE_TESTS = Path(__file__).resolve().parents[2] / "engine" / "tests"
PROMPT = "The capital of France is"


def _write_lora(path: Path, seed: int) -> Path:
    spec = importlib.util.spec_from_file_location("lora_adapters", ENGINE_TESTS / "lora_adapters.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.write_lora(path, smollm2_path(), seed=seed, scale=0.05)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("lora")
    return _write_lora(tmp / "a.gguf", 1), _write_lora(tmp / "b.gguf", 2)


@pytest.fixture(scope="module")
def lc(tmp_path_factory: pytest.TempPathFactory, adapters) -> Iterator[httpx.Client]:
    a, b = adapters
    tmp = tmp_path_factory.mktemp("lora-server")
    s = start_server(
        tmp, "--lora", str(a), "--lora-scaled", f"{b}:0.5", "-np", "2", "-c", "1024", "--temp", "0"
    )
    with s.client() as c:
        yield c
    stop_server(s)


def _complete(c: httpx.Client, lora=None) -> str:
    body = {"prompt": PROMPT, "n_predict": 12, "cache_prompt": True}
    if lora is not None:
        body["lora"] = lora
    r = c.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()["content"]


BASE = [{"id": 0, "scale": 0.0}]
ONLY_A = [{"id": 0, "scale": 1.0}]
ONLY_B = [{"id": 1, "scale": 1.0}]


def test_list_and_per_request_adapters(lc: httpx.Client, adapters) -> None:
    a, b = adapters
    assert lc.get("/lora-adapters").json() == [
        {"id": 0, "path": str(a), "scale": 1.0, "task_name": "", "prompt_prefix": ""},
        {"id": 1, "path": str(b), "scale": 0.5, "task_name": "", "prompt_prefix": ""},
    ]
    base, only_a, only_b = _complete(lc, BASE), _complete(lc, ONLY_A), _complete(lc, ONLY_B)
    assert len({base, only_a, only_b}) == 3
    both = _complete(lc, [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}])
    assert _complete(lc) == both and _complete(lc, []) == both  # no field: the global scales
    assert _complete(lc, [{"id": 7, "scale": 1.0}, "x"]) == base  # unknown ids and entries: ignored


def test_concurrent_requests_with_different_adapters(lc: httpx.Client) -> None:
    solo = {k: _complete(lc, v) for k, v in (("a", ONLY_A), ("b", ONLY_B))}
    got: dict[str, str] = {}
    threads = [
        threading.Thread(target=lambda k=k, v=v: got.__setitem__(k, _complete(lc, v)))
        for k, v in (("a", ONLY_A), ("b", ONLY_B))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == solo


def test_post_sets_the_global_scales(lc: httpx.Client) -> None:
    base = _complete(lc, BASE)
    try:
        r = lc.post("/lora-adapters", json=[{"id": 1, "scale": 1.0}])
        assert r.status_code == 200 and r.json() == {"success": True}
        assert [x["scale"] for x in lc.get("/lora-adapters").json()] == [0.0, 1.0]  # not listed: 0
        assert _complete(lc) == _complete(lc, ONLY_B)
        assert lc.post("/lora-adapters", json=[]).json() == {"success": True}
        assert _complete(lc) == base
    finally:
        lc.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}])


def test_bad_inputs(lc: httpx.Client) -> None:
    err = assert_error(lc.post("/lora-adapters", json={"id": 0, "scale": 1}), 400, "invalid_request_error")
    assert err["message"] == "Request body must be an array"
    r = lc.post("/completion", json={"prompt": PROMPT, "n_predict": 1, "lora": "a"})
    assert_error(r, 400, "invalid_request_error")
    assert lc.get("/health").status_code == 200


def test_flags() -> None:
    assert lora_from_flags(("a.gguf,b.gguf",), ("c.gguf:0.25",), False) == (
        ("a.gguf", 1.0),
        ("b.gguf", 1.0),
        ("c.gguf", 0.25),
    )
    assert lora_from_flags(("a.gguf",), ("c.gguf:2",), True) == (("a.gguf", 0.0), ("c.gguf", 0.0))
    with pytest.raises(click.UsageError, match="FNAME:SCALE"):
        lora_from_flags((), ("c.gguf",), False)
