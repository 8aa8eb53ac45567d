"""Router settings, decided once from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field

from llama_tools import CorsPolicy, ToolsConfig

__all__ = ["RouterConfig"]


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """What `llama-router`'s flags decide. `cli_options` are the other llama-server options given to the
    router (entry key -> value): they are overlaid on every entry (the command line wins over presets)."""

    host: str = "127.0.0.1"
    port: int = 8080
    models_dir: str | None = None
    models_preset: str | None = None
    models_max: int = 4
    models_autoload: bool = True
    cli_options: dict[str, str] = field(default_factory=dict)
    server_command: tuple[str, ...] = ("llama-server",)
    api_keys: tuple[str, ...] = ()
    cors: CorsPolicy = field(default_factory=CorsPolicy)
    tools: ToolsConfig = field(default_factory=ToolsConfig)  # /tools, MCP servers, /cors-proxy
    timeout: float = 3600.0
    max_waiting: int = 64  # requests waiting for a model load before 503 + Retry-After
    hf_token: str | None = None
    offline: bool = False
    webui: bool = True
    static_path: str | None = None
    health_interval: float = 5.0  # seconds between health checks of remote replicas
    keep_alive: float = -1.0  # --keep-alive: seconds a model stays loaded after a request (< 0: no limit)
    keep_alive_max: float = -1.0  # --keep-alive-max: the bound of every keep-alive (< 0: none)
    # the key(s) sent to the replicas of remote entries that name none (`--remote-api-key[-file]`)
    remote_api_keys: tuple[str, ...] = field(default=(), repr=False)
    # replicas on a Ray cluster (llama_router.cluster): "" (off), "auto", an address, or "local"
    ray: str = ""
    ray_nodes: int = 2  # nodes of `--ray local`
    ray_namespace: str = "llama-router"
    ray_keep_replicas: bool = False  # leave the replicas running at exit (a restarted router adopts them)
