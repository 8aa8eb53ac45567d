"""GET /props (server and model properties) and POST /props (with --props)."""

from __future__ import annotations

import os
import secrets

from litestar import Controller, Response, get, post

from llama_engine import GenerationRequest

from ..errors import ApiError
from ._common import BUILD_INFO, SharedState, generation_settings, json_response

__all__ = ["PropsController"]

MEDIA_MARKER = os.environ.get("LLAMA_MEDIA_MARKER") or f"<__media_{secrets.token_hex(16)}__>"


class PropsController(Controller):
    @get("/props")
    async def get_props(self, server: SharedState) -> Response:
        st = server
        engine = st.require_engine()
        cfg = st.config
        tok = engine.tokenizer
        defaults = GenerationRequest(
            prompt=[], max_tokens=-1, sampling=cfg.sampling, stop=list(cfg.reverse_prompts)
        )
        return json_response(
            {
                "default_generation_settings": {
                    "params": generation_settings(defaults, False, full=False),
                    "n_ctx": engine.n_ctx_slot,
                },
                "total_slots": cfg.n_parallel,
                "model_alias": st.model_name,
                "model_ftype": st.model_meta()["ftype"],
                "model_path": cfg.model,
                "modalities": {"vision": False, "video": False, "audio": False},
                "media_marker": MEDIA_MARKER,
                "endpoint_slots": cfg.endpoint_slots,
                "endpoint_props": cfg.endpoint_props,
                "endpoint_metrics": cfg.endpoint_metrics,
                "ui": cfg.webui,
                "ui_settings": {},
                "chat_template": st.template.source if st.template else "",
                "chat_template_caps": {
                    "supports_tools": st.template is not None and "tools" in st.template.source
                },
                "bos_token": tok.token_text(tok.bos_id) if tok.bos_id is not None else "",
                "eos_token": tok.token_text(tok.eos_id) if tok.eos_id is not None else "",
                "build_info": BUILD_INFO,
                "is_sleeping": False,
                "cors_proxy_enabled": cfg.tools.cors_proxy,
                "endpoint_conversations": st.store is not None,  # --store: the web UI keeps its chats there
            }
        )

    @post("/props", status_code=200)
    async def set_props(self, server: SharedState) -> Response:
        if not server.config.endpoint_props:
            raise ApiError(
                "This server does not support changing global properties. Start it with `--props`",
                "not_supported_error",
            )
        return json_response({"success": True})
