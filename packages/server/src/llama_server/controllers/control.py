"""POST /v1/chat/completions/control (endpoints.md §5.4): act on a running chat completion."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, post

from ..errors import ApiError
from ._common import SharedState, json_response

__all__ = ["ControlController"]


class ControlController(Controller):
    @post("/v1/chat/completions/control", status_code=200)
    async def control(self, request: Request, server: SharedState) -> Response:
        try:
            body: Any = await request.json()
        except Exception:
            raise ApiError("Invalid JSON body") from None
        if not isinstance(body, dict) or not isinstance(body.get("id"), str) or not body["id"]:
            raise ApiError("missing completion id")
        if body.get("action") != "reasoning_end":
            raise ApiError("unknown control action")
        ok, message = server.live.end_reasoning(body["id"])
        return json_response({"success": True} if ok else {"success": False, "message": message})
