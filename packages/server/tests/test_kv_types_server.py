"""llama-server's -ctk/-ctv/-fa: the reference's values and errors, and a real server on a quantized cache."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from conftest import start_server, stop_server


def _config(*argv: str):
    from llama_server.cli import build_config, main

    return build_config(main.make_context("llama-server", list(argv)).params)


def test_cache_type_and_flash_attention_flags() -> None:
    cfg = _config()
    assert (cfg.cache_type_k, cfg.cache_type_v, cfg.flash_attn) == ("f16", "f16", "auto")
    cfg = _config("-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on")
    assert (cfg.cache_type_k, cfg.cache_type_v, cfg.flash_attn) == ("q8_0", "q4_0", "on")
    for spelling, value in (("enabled", "on"), ("false", "off"), ("auto", "auto"), ("1", "on"), ("0", "off")):
        assert _config("--flash-attn", spelling).flash_attn == value
    assert _config("--cache-type-k", "iq4_nl", "--cache-type-v", "bf16").cache_type_v == "bf16"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-ctk", "q2_k"], "Unsupported cache type: q2_k"),
        (["-ctv", "f64"], "Unsupported cache type: f64"),
        (["-fa", "maybe"], "unknown value for --flash-attn: 'maybe'"),
        (["-ctv", "q8_0", "-fa", "off"], "quantized V cache requires flash_attn to be enabled"),
    ],
)
def test_bad_values_are_rejected(argv: list[str], message: str) -> None:
    with pytest.raises(click.UsageError, match=message):
        _config(*argv)


def test_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_ARG_FLASH_ATTN", "on")
    monkeypatch.setenv("LLAMA_ARG_CACHE_TYPE_K", "q5_1")
    cfg = _config()
    assert (cfg.cache_type_k, cfg.flash_attn) == ("q5_1", "on")


def test_server_on_a_quantized_cache(tmp_path: Path) -> None:
    server = start_server(tmp_path, "-ctk", "q8_0", "-ctv", "q8_0", "-c", "512", "--no-warmup")
    try:
        with server.client() as c:
            body = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}
            r = c.post("/completion", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["tokens_predicted"] == 8
            again = c.post("/completion", json={**body, "cache_prompt": False})
            assert again.json()["content"] == r.json()["content"]
            assert c.get("/health").status_code == 200
    finally:
        stop_server(server)
