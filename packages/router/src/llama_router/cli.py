"""`llama-router`: many models behind one address. Takes llama-server's flags: the router's own (models,
HTTP, API keys, CORS) are read here; every other llama-server option is passed to each child (and wins
over preset values)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import click
from llama_tools import cors_options, cors_policy_from_options, tools_config_from_options, tools_options

from . import options as opts
from .catalogue import CatalogueError, parse_keys, read_key_file
from .config import RouterConfig
from .keep_alive import KeepAliveError, parse_keep_alive

__all__ = ["long_form_args", "main", "parse_child_options", "server_command"]


def parse_child_options(args: list[str]) -> dict[str, str]:
    """llama-server options given to the router, as entry options (negative flags become `false`)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("-") or token == "-":
            raise click.UsageError(f"unexpected argument: {token!r}")
        name, eq, inline = token.partition("=")
        try:
            opt, negative = opts.lookup(name)
        except opts.UnknownOption:
            raise click.UsageError(f"unknown option: {name}") from None
        if opt.value:
            if eq:
                value = inline
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                raise click.UsageError(f"option {name} needs a value")
        else:
            value = "false" if negative else "true"
        out[opt.key] = value
        i += 1
    return out


def long_form_args(args: list[str]) -> list[str]:
    """llama.cpp's single-dash multi-letter options (`-hf`, `-np`, `-no-kvu`, `-ctv`) in their long form:
    click would read them as clusters of one-letter flags (`-h`, `-v`, ...)."""
    out: list[str] = []
    takes_value = False
    for token in args:
        if takes_value or not token.startswith("-") or token.startswith("--") or len(token) <= 2:
            takes_value = takes_value is False and token.startswith("-") and _value_option(token)
            out.append(token)
            continue
        name, eq, inline = token.partition("=")
        try:
            opt, negative = opts.lookup(name)
        except opts.UnknownOption:
            out.append(token)
            continue
        long = next((n for n in opt.negative if n.startswith("--")), opt.long) if negative else opt.long
        out.append(long + eq + inline)
        takes_value = opt.value and not eq
    return out


def _value_option(token: str) -> bool:
    if "=" in token:
        return False
    try:
        return opts.lookup(token)[0].value
    except opts.UnknownOption:
        return False


def server_command() -> tuple[str, ...]:
    """How a child is started: `LLAMA_SERVER_BIN` (set by `llama-server` when it runs the router), else
    the `llama-server` beside this interpreter, else the one on PATH."""
    if os.environ.get("LLAMA_SERVER_BIN"):
        return (os.environ["LLAMA_SERVER_BIN"],)
    beside = Path(sys.executable).parent / "llama-server"
    if beside.is_file():
        return (str(beside),)
    found = shutil.which("llama-server")
    if found is None:
        raise click.UsageError("llama-server is not installed: the router starts it for each model")
    return (found,)


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, made with protocol IPPROTO_TCP: asyncio sets TCP_NODELAY only on accepted
    sockets that say so (`socket.create_server` leaves it 0), and with Nagle on, every small response on a
    kept-alive connection waits ~40 ms for the client's delayed ACK."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(2048)
    return sock


def _keys(api_key: str | None, api_key_file: str | None) -> tuple[str, ...]:
    keys = [k for k in (api_key or "").split(",") if k]
    if api_key_file:
        for line in Path(api_key_file).read_text().splitlines():
            if line.strip() and not line.strip().startswith("#"):
                keys.append(line.strip())
    return tuple(keys)


def _remote_keys(keys: str | None, path: str | None) -> tuple[str, ...]:
    if keys is not None and path is not None:
        raise click.UsageError("give --remote-api-key or --remote-api-key-file, not both")
    try:
        return read_key_file(path) if path is not None else parse_keys(keys) if keys else ()
    except CatalogueError as e:
        raise click.UsageError(str(e)) from None


def _duration(value: str, flag: str) -> float:
    try:
        return parse_keep_alive(value)
    except KeepAliveError as e:
        raise click.UsageError(f"{flag}: {e}") from None


_CTX = {
    "help_option_names": ["-h", "--help"],
    "ignore_unknown_options": True,
    "allow_extra_args": True,
    "max_content_width": 110,
}


@click.command(context_settings=_CTX)
@click.option("--models-dir", envvar="LLAMA_ARG_MODELS_DIR", help="Directory of GGUF models.")
@click.option("--models-preset", envvar="LLAMA_ARG_MODELS_PRESET", help="INI file of model presets.")
@click.option("--models-max", type=int, default=4, envvar="LLAMA_ARG_MODELS_MAX", show_default=True)
@click.option("--models-autoload/--no-models-autoload", default=True, envvar="LLAMA_ARG_MODELS_AUTOLOAD")
@click.option("--host", default="127.0.0.1", envvar="LLAMA_ARG_HOST", show_default=True)
@click.option("--port", type=int, default=8080, envvar="LLAMA_ARG_PORT", show_default=True)
@click.option("--api-key", envvar="LLAMA_API_KEY", help="Comma-separated API keys.")
@click.option("--api-key-file", envvar="LLAMA_ARG_API_KEY_FILE", type=click.Path(dir_okay=False))
@click.option("--ssl-key-file", envvar="LLAMA_ARG_SSL_KEY_FILE")
@click.option("--ssl-cert-file", envvar="LLAMA_ARG_SSL_CERT_FILE")
@cors_options
@tools_options
@click.option("-to", "--timeout", type=int, default=3600, envvar="LLAMA_ARG_TIMEOUT")
@click.option("--max-queue", type=int, default=64, help="Requests waiting for a model before 503.")
@click.option("-hft", "--hf-token", envvar="HF_TOKEN", help="Token for the model hub (sent only to it).")
@click.option("--offline", is_flag=True, envvar="LLAMA_ARG_OFFLINE")
@click.option(
    "--replica-check-interval",
    type=float,
    default=5.0,
    envvar="LLAMA_ARG_REPLICA_CHECK_INTERVAL",
    help="Seconds between health checks of remote replicas.",
)
@click.option(
    "--remote-api-key",
    envvar="LLAMA_ARG_REMOTE_API_KEY",
    help="API key sent to the replicas of remote models whose preset names none: one key, or a comma list "
    "with one key per `remote` URL.",
)
@click.option(
    "--remote-api-key-file",
    envvar="LLAMA_ARG_REMOTE_API_KEY_FILE",
    type=click.Path(dir_okay=False),
    help="File of remote API keys, one per line (as --remote-api-key's list).",
)
@click.option(
    "--keep-alive",
    default="-1",
    envvar="LLAMA_ARG_KEEP_ALIVE",
    help="How long a model stays loaded after its last request: seconds or a duration (30s, 5m, 1h); "
    "negative: until evicted (default). A request's `keep_alive` overrides it.",
)
@click.option(
    "--keep-alive-max",
    default="-1",
    envvar="LLAMA_ARG_KEEP_ALIVE_MAX",
    help="The longest keep-alive a request or preset may ask for (negative: no bound).",
)
@click.option(
    "--ray",
    default="",
    envvar="LLAMA_ARG_RAY",
    help="Place the replicas of presets with `replicas`/`min-replicas`/`max-replicas` on a Ray cluster: auto "
    "(the running cluster), ADDRESS (host:port of its head), or local (start --ray-nodes nodes on this "
    "machine). Needs pip install 'llama-router[ray]'.",
)
@click.option("--ray-nodes", type=int, default=2, show_default=True, help="Nodes of `--ray local`.")
@click.option(
    "--ray-namespace",
    default="llama-router",
    show_default=True,
    help="Ray namespace of this router's replicas (two routers on one cluster need two).",
)
@click.option(
    "--ray-keep-replicas",
    is_flag=True,
    help="Leave the replicas running when the router exits; the next router with the same namespace "
    "adopts them.",
)
@click.option("--ui/--no-ui", "--webui/--no-webui", "webui", default=True, envvar="LLAMA_ARG_UI")
@click.option("--path", "static_path", envvar="LLAMA_ARG_STATIC_PATH", type=click.Path(file_okay=False))
@click.option("-v", "--verbose", is_flag=True)
@click.option("--log-disable", is_flag=True)
@click.pass_context
def command(ctx: click.Context, **kw: Any) -> None:
    """Serve many GGUF models behind one address: one llama-server child per loaded model."""
    child_options = parse_child_options(list(ctx.args))
    if kw["offline"]:
        child_options["offline"] = "true"
    if kw["timeout"] != 3600:
        child_options["timeout"] = str(kw["timeout"])
    child_options["max-queue"] = str(kw["max_queue"])
    level = logging.DEBUG if kw["verbose"] else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied request otherwise
    if kw["log_disable"]:
        logging.disable(logging.CRITICAL)
    tools = tools_config_from_options(kw)
    sock = _listen(kw["host"], kw["port"])
    port = sock.getsockname()[1]
    cfg = RouterConfig(
        host=kw["host"],
        port=port,
        models_dir=kw["models_dir"],
        models_preset=kw["models_preset"],
        models_max=kw["models_max"],
        models_autoload=kw["models_autoload"],
        cli_options=child_options,
        server_command=server_command(),
        api_keys=_keys(kw["api_key"], kw["api_key_file"]),
        cors=cors_policy_from_options(kw, tools),
        tools=tools,
        timeout=kw["timeout"],
        max_waiting=kw["max_queue"],
        hf_token=kw["hf_token"],
        offline=kw["offline"],
        webui=kw["webui"],
        static_path=kw["static_path"],
        health_interval=max(kw["replica_check_interval"], 0.1),
        remote_api_keys=_remote_keys(kw["remote_api_key"], kw["remote_api_key_file"]),
        keep_alive=_duration(kw["keep_alive"], "--keep-alive"),
        keep_alive_max=_duration(kw["keep_alive_max"], "--keep-alive-max"),
        ray=kw["ray"],
        ray_nodes=max(kw["ray_nodes"], 1),
        ray_namespace=kw["ray_namespace"],
        ray_keep_replicas=kw["ray_keep_replicas"],
    )
    from .app import create_app
    from .cluster import ClusterError

    try:
        app = create_app(cfg)
    except (CatalogueError, ClusterError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    import uvicorn

    click.echo(f"llama-router: listening on http://{cfg.host}:{cfg.port}", err=True)
    # loop and http "auto": uvloop and httptools (dependencies of the router). Every streamed token passes
    # through here, and they take the relay from ~160 to ~90 us of CPU per event (h11 and asyncio's own loop
    # frame and dispatch each chunk in Python), time a busy machine would otherwise take from decoding.
    config = uvicorn.Config(
        app,
        loop="auto",
        http="auto",
        log_level="warning",
        server_header=False,
        timeout_graceful_shutdown=5,
        ssl_keyfile=kw["ssl_key_file"],
        ssl_certfile=kw["ssl_cert_file"],
    )
    # what is built by now (the app, its routes and schemas, the catalogue, the imported libraries) lives as
    # long as the process: frozen out of the collector, so a full collection set off by some request walks
    # only what requests made, not tens of thousands of long-lived objects while every relayed stream waits
    gc.collect()
    gc.freeze()
    # the socket itself, not its fd: uvicorn would wrap an fd as a Unix socket (Nagle left on again)
    _serve(config, sock, app.on_exit)


def _serve(config: Any, sock: socket.socket, on_exit: Callable[[], None]) -> None:
    """Run uvicorn until SIGTERM/SIGINT; `on_exit` runs on the event loop at the signal, before uvicorn
    waits (up to `timeout_graceful_shutdown`) for the open connections: a request held open by work it
    ends (a slow tool call) would otherwise hold the exit for the whole wait."""
    import uvicorn

    class ExitingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            with contextlib.suppress(RuntimeError):  # no loop running: nothing is in flight
                asyncio.get_running_loop().call_soon_threadsafe(on_exit)
            super().handle_exit(sig, frame)

    ExitingServer(config).run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    """The `llama-router` command."""
    args = sys.argv[1:] if argv is None else argv
    command.main(args=long_form_args(args), prog_name="llama-router")
