"""GET /v1/models and /models (identical)."""

from __future__ import annotations

from litestar import Controller, Response, get

from ._common import SharedState, json_response

__all__ = ["ModelsController"]


class ModelsController(Controller):
    @get(["/v1/models", "/models"])
    async def models(self, server: SharedState) -> Response:
        st = server
        name = st.model_name
        return json_response(
            {
                "models": [
                    {
                        "name": name,
                        "model": name,
                        "modified_at": "",
                        "size": "",
                        "digest": "",
                        "type": "model",
                        "description": "",
                        "tags": [""],
                        "capabilities": ["completion"],
                        "parameters": "",
                        "details": {
                            "parent_model": "",
                            "format": "gguf",
                            "family": "",
                            "families": [""],
                            "parameter_size": "",
                            "quantization_level": "",
                        },
                    }
                ],
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "aliases": sorted(st.config.alias),
                        "tags": sorted(st.config.tags),
                        "object": "model",
                        "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                        "created": int(st.started),
                        "owned_by": "llamacpp",
                        "meta": st.model_meta(),
                    }
                ],
            }
        )
