"""Engine-free server features shared by ``llama-server`` and ``llama-router``: the built-in tools and MCP
servers of ``/tools``, the ``/cors-proxy`` helper, the CORS origin policy, and the edge guard of the routes
that act on the machine (``RequestGuard``: Host, Origin and Content-Type checks against cross-site requests
and DNS rebinding).

Nothing here imports numba or the engine, so the router can serve these routes without either::

    config = tools_config_from_options(kw)          # from the click options of `tools_options`
    service = ToolsService(config)
    app = Litestar(route_handlers=tools_route_handlers(service), lifespan=[service.lifespan])
"""

from .cli import cors_options, cors_policy_from_options, tools_config_from_options, tools_options
from .config import BUILTIN_TOOL_NAMES, McpServerSpec, ToolsConfig, ToolsConfigError
from .cors import CorsPolicy, cors_origins_default
from .guard import Refusal, RequestGuard, guard_kind
from .routes import FEATURE_DISABLED, tools_route_handlers
from .service import ToolError, ToolsService

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "FEATURE_DISABLED",
    "CorsPolicy",
    "McpServerSpec",
    "Refusal",
    "RequestGuard",
    "ToolError",
    "ToolsConfig",
    "ToolsConfigError",
    "ToolsService",
    "cors_options",
    "cors_origins_default",
    "cors_policy_from_options",
    "guard_kind",
    "tools_config_from_options",
    "tools_options",
    "tools_route_handlers",
]
