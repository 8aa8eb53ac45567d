"""llama-server flags that change the model: --override-kv and --rope-freq-base reach the engine's model."""

from __future__ import annotations

import click
import pytest
from conftest import smollm2_path

from gguf_io import open as open_gguf
from llama_engine.arch import load_model
from llama_server.cli import build_config, main
from llama_server.model_overrides import open_with_overrides, parse_override_kv


def test_override_kv_parsing():
    assert parse_override_kv("llama.context_length=int:4096") == ("llama.context_length", 4096)
    assert parse_override_kv("a.b=float:0.5") == ("a.b", 0.5)
    assert parse_override_kv("a=bool:false") == ("a", False)
    assert parse_override_kv("a=str:x:y") == ("a", "x:y")
    for bad in ("a", "a=int", "a=long:1", "a=int:x", "a=bool:yes"):
        with pytest.raises(ValueError):
            parse_override_kv(bad)


def test_overrides_reach_the_model():
    path = str(smollm2_path())
    assert open_with_overrides(path, (), None) == path  # nothing to change: the engine opens the file
    gguf = open_with_overrides(path, (("llama.context_length", 1024),), 50000.0)
    config = load_model(gguf).config
    assert config.rope_base == 50000.0 and config.n_ctx_train == 1024
    assert gguf.metadata["llama.rope.freq_base"] == 50000.0


def test_flags_are_accepted_on_the_command_line():
    ctx = main.make_context(
        "llama-server",
        [
            "-m",
            str(smollm2_path()),
            "--override-kv",
            "llama.context_length=int:1024",
            "--rope-freq-base",
            "1e4",
            "--spm-infill",
        ],
    )
    cfg = build_config(ctx.params)
    assert (
        cfg.override_kv == (("llama.context_length", 1024),) and cfg.rope_freq_base == 1e4 and cfg.spm_infill
    )
    bad = main.make_context("llama-server", ["-m", str(smollm2_path()), "--override-kv", "x=int:y"])
    with pytest.raises(click.UsageError, match="override-kv"):
        build_config(bad.params)


def test_rope_scaling_flags_reach_the_model():
    path = str(smollm2_path())
    args = ["-m", path, "--rope-scaling", "yarn", "--rope-freq-scale", "0.25", "--yarn-orig-ctx", "2048"]
    cfg = build_config(main.make_context("llama-server", [*args, "--yarn-beta-fast", "16"]).params)
    assert cfg.override_kv == (
        ("llama.rope.scaling.type", "yarn"),
        ("llama.rope.scaling.factor", 4.0),
        ("llama.rope.scaling.original_context_length", 2048),
        ("llama.rope.scaling.yarn_beta_fast", 16.0),
    )
    model = load_model(open_with_overrides(path, cfg.override_kv, None))
    s = model.rope_scaling
    assert (s.freq_scale, s.ext_factor, s.n_ctx_orig, s.beta_fast, s.beta_slow) == (
        0.25,
        1.0,
        2048,
        16.0,
        1.0,
    )
    linear = build_config(main.make_context("llama-server", ["-m", path, "--rope-scale", "2"]).params)
    assert load_model(open_with_overrides(path, linear.override_kv, None)).rope_scaling.freq_scale == 0.5
    plain = build_config(main.make_context("llama-server", ["-m", path, "--yarn-ext-factor", "-1"]).params)
    assert plain.override_kv == ()  # negative: llama.cpp's "not set"
    assert load_model(open_gguf(path)).rope_scaling.freq_scale == 1.0
    with pytest.raises(click.BadParameter):
        main.make_context("llama-server", ["-m", path, "--rope-scaling", "longrope"])


def test_log_flags_shape_the_lines(capsys):
    import logging
    import re

    from llama_server.logs import setup_logging

    def lines(*args: str) -> str:
        kw = main.make_context("llama-server", ["-m", str(smollm2_path()), *args]).params
        setup_logging(kw)
        logging.getLogger("llama_server").info("hello")
        return capsys.readouterr().err.strip().splitlines()[-1]

    try:
        assert lines() == "INFO llama_server: hello"
        assert lines("--no-log-prefix") == "hello"
        assert re.fullmatch(
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO llama_server: hello", lines("--log-timestamps")
        )
        assert lines("--log-colors", "on") == "\x1b[32mINFO\x1b[0m llama_server: hello"
        assert lines("--log-colors", "auto") == "INFO llama_server: hello"  # not a terminal
        assert lines("--log-jsonl", "--log-colors", "on") == '{"level":"INFO","msg":"hello"}'
        with pytest.raises(click.BadParameter):
            lines("--log-colors", "sometimes")
    finally:
        logging.basicConfig(level=logging.WARNING, force=True)
