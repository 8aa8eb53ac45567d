"""GET /health: 200 once the model is loaded (the edge middleware answers 503 while it loads)."""

from __future__ import annotations

from litestar import Controller, Response, get

from ._common import json_response

__all__ = ["HealthController"]


class HealthController(Controller):
    @get(["/health", "/v1/health"])
    async def health(self) -> Response:
        return json_response({"status": "ok"})
