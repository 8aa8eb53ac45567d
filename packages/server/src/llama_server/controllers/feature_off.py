"""Routes llama-server has whose feature this server does not offer (or the command line left off): they
answer as llama-server does then, instead of 404.

- `/v1/audio/transcriptions` (and `/audio/transcriptions`): 501, no audio projector is loaded.
"""

from __future__ import annotations

from litestar import Controller, Response, post

from ..errors import ApiError

__all__ = ["FeatureOffController"]


class FeatureOffController(Controller):
    @post(["/v1/audio/transcriptions", "/audio/transcriptions"], status_code=200)
    async def transcriptions(self) -> Response:
        raise ApiError("The current model does not support audio input.", "not_supported_error")
