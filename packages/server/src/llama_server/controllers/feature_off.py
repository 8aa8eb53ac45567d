"""Routes llama-server has whose feature this server does not offer (or the command line left off): they
answer as llama-server does then, instead of 404.

- `/v1/audio/transcriptions` (and `/audio/transcriptions`): 501, no audio projector is loaded.
- `/v1/chat/completions/control` (endpoints.md §5.4): the body is checked as llama-server checks it; no
  running completion accepts reasoning control here, so a well-formed call answers `success: false`.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, post

from ..errors import ApiError
from ._common import json_response

__all__ = ["FeatureOffController"]


class FeatureOffController(Controller):
    @post(["/v1/audio/transcriptions", "/audio/transcriptions"], status_code=200)
    async def transcriptions(self) -> Response:
        raise ApiError("The current model does not support audio input.", "not_supported_error")

    @post("/v1/chat/completions/control", status_code=200)
    async def control(self, request: Request) -> Response:
        try:
            body: Any = await request.json()
        except Exception:
            raise ApiError("Invalid JSON body") from None
        if not isinstance(body, dict) or not isinstance(body.get("id"), str) or not body["id"]:
            raise ApiError("missing completion id")
        if body.get("action") != "reasoning_end":
            raise ApiError("unknown control action")
        return json_response({"success": False, "message": "no active completion for this id"})
