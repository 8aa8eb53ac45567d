"""Engine-free server features shared by ``llama-server`` and ``llama-router``: the built-in tools and MCP
servers of ``/tools``, the ``/cors-proxy`` helper, and the CORS origin policy.

Nothing here imports numba or the engine, so the router can serve these routes without either::

    config = tools_config_from_options(kw)          # from the click options of `tools_options`
    service = ToolsService(config)
    app = Litestar(route_handlers=tools_route_handlers(service), lifespan=[service.lifespan])
"""

from .cli import cors_options, cors_policy_from_options, tools_config_from_options, tools_options
from .config import BUILTIN_TOOL_NAMES, McpServerSpec, ToolsConfig, ToolsConfigError
from .cors import CorsPolicy, cors_origins_default
from .routes import FEATURE_DISABLED, tools_route_handlers
from .service import ToolError, ToolsService

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "FEATURE_DISABLED",
    "CorsPolicy",
    "McpServerSpec",
    "ToolError",
    "ToolsConfig",
    "ToolsConfigError",
    "ToolsService",
    "cors_options",
    "cors_origins_default",
    "cors_policy_from_options",
    "tools_config_from_options",
    "tools_options",
    "tools_route_handlers",
]
