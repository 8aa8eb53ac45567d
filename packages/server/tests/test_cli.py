"""The `llama-server` command line (click's CliRunner; uvicorn.run is replaced so nothing listens)."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner
from conftest import smollm2_path

from llama_server import cli
from llama_server.cli import main


@pytest.fixture
def captured(monkeypatch):
    """What `main` would serve: the app, its state and uvicorn's options (nothing listens)."""
    seen: dict = {}

    def fake_serve(app, state, **kw):
        seen.update(app=app, state=state, **kw)

    monkeypatch.setattr(cli, "serve", fake_serve)
    return seen


def _cfg(seen):
    assert seen["app"].state.server is seen["state"]  # the app create_app built for that state
    return seen["state"].config


def test_help():
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0 and "--ctx-size" in r.output and "--api-key" in r.output


def test_unknown_flag_is_an_error():
    r = CliRunner().invoke(main, ["--definitely-not-a-flag"])
    assert r.exit_code != 0 and "No such option" in r.output


def test_flags(captured):
    r = CliRunner().invoke(
        main,
        [
            "-m",
            str(smollm2_path()),
            "-c",
            "1024",
            "-np",
            "2",
            "--port",
            "9999",
            "-a",
            "b,a",
            "--temp",
            "0.5",
            "--metrics",
            "--no-slots",
            "-n",
            "7",
            "--cors-origins",
            "localhost",
        ],
    )
    assert r.exit_code == 0, r.output
    cfg = _cfg(captured)
    assert (cfg.n_ctx, cfg.n_parallel, cfg.model_name, cfg.n_predict) == (1024, 2, "a", 7)
    assert cfg.sampling.temperature == 0.5 and cfg.endpoint_metrics and not cfg.endpoint_slots
    assert captured["port"] == 9999 and cfg.cors_origins == "localhost"


def test_defaults_bundled_model_and_auto_slots(captured):
    r = CliRunner().invoke(main, [])
    assert r.exit_code == 0, r.output
    cfg = _cfg(captured)
    assert cfg.model.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and cfg.n_parallel == 4 and cfg.kv_unified
    assert captured["host"] == "127.0.0.1" and captured["port"] == 8080


def test_env_vars_and_cli_wins(captured, tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text("# comment\nk2\n")
    env = {
        "LLAMA_ARG_CTX_SIZE": "512",
        "LLAMA_ARG_PORT": "7000",
        "LLAMA_API_KEY": "k1",
        "LLAMA_ARG_N_PARALLEL": "3",
    }
    r = CliRunner().invoke(main, ["--port", "7001", "--api-key-file", str(keyfile)], env=env)
    assert r.exit_code == 0, r.output
    cfg = _cfg(captured)
    assert (
        cfg.n_ctx == 512 and cfg.n_parallel == 3 and captured["port"] == 7001 and cfg.api_keys == ("k1", "k2")
    )


def test_ignored_flags_notice(captured):
    r = CliRunner().invoke(
        main,
        ["-ngl", "99", "-fa", "on", "--mlock", "--numa", "distribute", "-dev", "none", "--media-path", "."],
    )
    assert r.exit_code == 0, r.output
    assert "has no effect" in r.output and "--media-path has no effect" in r.output


def test_invalid_values():
    assert CliRunner().invoke(main, ["-np", "0"]).exit_code != 0
    assert CliRunner().invoke(main, ["-m", "/nonexistent.gguf"]).exit_code != 0
    assert CliRunner().invoke(main, ["--top-p", "7"]).exit_code != 0
    assert CliRunner().invoke(main, ["--chat-template-kwargs", "[1]"]).exit_code != 0


def test_port_zero_picks_a_free_port(captured):
    r = CliRunner().invoke(main, ["--port", "0"])
    assert r.exit_code == 0, r.output
    (sock,) = captured["sockets"]
    assert _cfg(captured).port == sock.getsockname()[1] > 0
    # made as a TCP socket, so asyncio turns Nagle off (else kept-alive responses wait ~40 ms for an ACK)
    assert sock.proto == socket.IPPROTO_TCP


def test_cache_types(captured):
    r = CliRunner().invoke(main, [])
    assert r.exit_code == 0, r.output
    assert (_cfg(captured).cache_type_k, _cfg(captured).cache_type_v) == ("f16", "f16")  # llama.cpp's default
    r = CliRunner().invoke(main, ["-ctk", "f32"], env={"LLAMA_ARG_CACHE_TYPE_V": "f32"})
    assert r.exit_code == 0, r.output
    assert (_cfg(captured).cache_type_k, _cfg(captured).cache_type_v) == ("f32", "f32")
    r = CliRunner().invoke(main, ["--cache-type-v", "q3_k"])
    assert r.exit_code != 0 and "Unsupported cache type: q3_k" in r.output
    r = CliRunner().invoke(main, ["-ctk", "q8_0", "-ctv", "q4_0"])  # -fa auto turns flash attention on
    assert r.exit_code == 0, r.output
    assert (_cfg(captured).cache_type_k, _cfg(captured).cache_type_v) == ("q8_0", "q4_0")
    r = CliRunner().invoke(main, ["-fa", "off", "-ctv", "q4_0"])
    assert r.exit_code != 0 and "quantized V cache requires flash_attn" in r.output


def test_logit_bias_flag(captured):
    r = CliRunner().invoke(main, ["-l", "15+1e30", "-l", "16-2.5", "--logit-bias", "2-inf"])
    assert r.exit_code == 0, r.output
    assert _cfg(captured).sampling.logit_bias == ((15, 1e30), (16, -2.5), (2, float("-inf")))
    for value in ("15+1e308", "15-1e308", "15+1e31", "15+inf", "15+nan"):
        r = CliRunner().invoke(main, ["--logit-bias", value])
        assert r.exit_code == 2 and "finite within" in r.output, (value, r.output)


def test_exact_floats_flag_and_environment_variable(captured):
    """Fast float kernels unless `--exact-floats` or LLAMA_EXACT_FLOATS asks for the portable build's bits."""
    env = {"LLAMA_EXACT_FLOATS": None}
    assert CliRunner().invoke(main, [], env=env).exit_code == 0
    assert _cfg(captured).exact_floats is False
    assert CliRunner().invoke(main, ["--exact-floats"], env=env).exit_code == 0
    assert _cfg(captured).exact_floats is True
    assert CliRunner().invoke(main, [], env={"LLAMA_EXACT_FLOATS": "1"}).exit_code == 0
    assert _cfg(captured).exact_floats is True
