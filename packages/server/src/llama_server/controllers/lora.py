"""GET and POST /lora-adapters: the loaded LoRA adapters and their global scales (endpoints.md §21)."""

from __future__ import annotations

import msgspec
from litestar import Controller, Request, Response, get, post

from ..errors import ApiError
from ..lora import global_scales, set_global_scales
from ._common import SharedState, json_response

__all__ = ["LoraController"]


class LoraController(Controller):
    @get("/lora-adapters")
    async def list_adapters(self, server: SharedState) -> Response:
        engine = server.require_engine()
        scales = global_scales(server)
        return json_response(
            [
                {
                    "id": i,
                    "path": path,
                    "scale": scales[i],
                    "task_name": a.task_name,
                    "prompt_prefix": a.prompt_prefix,
                }
                for i, ((path, _), a) in enumerate(zip(server.config.lora, engine.loras, strict=True))
            ]
        )

    @post("/lora-adapters", status_code=200)
    async def set_adapters(self, request: Request, server: SharedState) -> Response:
        try:
            body = msgspec.json.decode(await request.body())
        except msgspec.DecodeError:
            raise ApiError("Invalid JSON body") from None
        set_global_scales(server, body)
        return json_response({"success": True})
