"""GET /metrics: Prometheus text with llama.cpp's metric names (with --metrics)."""

from __future__ import annotations

from litestar import Controller, Request, Response, get

from ..errors import ApiError
from ._common import server_state

__all__ = ["MetricsController"]


def _fmt(v: float) -> str:
    return f"{v:.6g}"  # C++ default stream formatting: 6 significant digits


class MetricsController(Controller):
    @get("/metrics")
    async def metrics(self, request: Request) -> Response:
        st = server_state(request)
        if not st.config.endpoint_metrics:
            raise ApiError(
                "This server does not support metrics endpoint. Start it with `--metrics`",
                "not_supported_error",
            )
        engine = st.require_engine()
        m = st.metrics
        busy = sum(1 for s in engine.slots() if s.is_processing)
        prompt_rate = m.window_prompt_tokens / m.window_prompt_seconds if m.window_prompt_seconds else 0.0
        gen_rate = (
            m.window_predicted_tokens / m.window_predicted_seconds if m.window_predicted_seconds else 0.0
        )
        m.window_prompt_tokens = m.window_predicted_tokens = 0
        m.window_prompt_seconds = m.window_predicted_seconds = 0.0
        rows = [
            ("counter", "prompt_tokens_total", "Number of prompt tokens processed.", m.prompt_tokens_total),
            ("counter", "prompt_tokens_cached_total", "Number of prompt tokens reused from the cache.",
             m.prompt_tokens_cached_total),
            ("counter", "prompt_seconds_total", "Prompt process time", m.prompt_seconds_total),
            ("counter", "tokens_predicted_total", "Number of generation tokens processed.", m.tokens_predicted_total),
            ("counter", "tokens_predicted_seconds_total", "Predict process time", m.tokens_predicted_seconds_total),
            ("counter", "n_decode_total", "Total number of llama_decode() calls", engine.steps),
            ("counter", "n_tokens_max", "Largest observed n_tokens.", m.n_tokens_max),
            ("counter", "spec_decode_num_draft_tokens_total", "Number of drafted tokens.", 0),
            ("counter", "spec_decode_num_accepted_tokens_total", "Number of accepted drafted tokens.", 0),
            ("counter", "spec_decode_num_drafts_total", "Number of speculative verification steps.", 0),
            ("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s.", prompt_rate),
            ("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s.", gen_rate),
            ("gauge", "requests_processing", "Number of requests processing.", busy),
            ("gauge", "requests_deferred", "Number of requests deferred.", engine.n_waiting),
            ("gauge", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             busy),
        ]  # fmt: skip
        lines = []
        for kind, name, help_text, value in rows:
            lines += [
                f"# HELP llamacpp:{name} {help_text}",
                f"# TYPE llamacpp:{name} {kind}",
                f"llamacpp:{name} {_fmt(value)}",
            ]
        return Response(
            "\n".join(lines) + "\n",
            media_type="text/plain; version=0.0.4",
            headers={"Process-Start-Time-Unix": str(int(st.started))},
        )
