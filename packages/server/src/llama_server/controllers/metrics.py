"""GET /metrics: Prometheus text with llama.cpp's metric names (with --metrics)."""

from __future__ import annotations

from litestar import Controller, Response, get

from ..errors import ApiError
from ..speculative_flags import spec_counters, spec_per_position
from ._common import SharedState

__all__ = ["MetricsController"]


def _fmt(v: float) -> str:
    return f"{v:.6g}"  # C++ default stream formatting: 6 significant digits


# name: (kind, help text), in llama.cpp's order
_METRICS = {
    "prompt_tokens_total": ("counter", "Number of prompt tokens processed."),
    "prompt_tokens_cached_total": ("counter", "Number of prompt tokens reused from the cache."),
    "prompt_seconds_total": ("counter", "Prompt process time"),
    "tokens_predicted_total": ("counter", "Number of generation tokens processed."),
    "tokens_predicted_seconds_total": ("counter", "Predict process time"),
    "n_decode_total": ("counter", "Total number of llama_decode() calls"),
    "n_tokens_max": ("counter", "Largest observed n_tokens."),
    "n_preemptions_total": ("counter", "Requests preempted by one of higher priority."),
    "n_interrupted_total": ("counter", "Prompt steps abandoned for a newly arrived request."),
    "spec_decode_num_draft_tokens_total": ("counter", "Number of drafted tokens."),
    "spec_decode_num_accepted_tokens_total": ("counter", "Number of accepted drafted tokens."),
    "spec_decode_num_drafts_total": ("counter", "Number of speculative verification steps."),
    "prompt_tokens_seconds": ("gauge", "Average prompt throughput in tokens/s."),
    "predicted_tokens_seconds": ("gauge", "Average generation throughput in tokens/s."),
    "requests_processing": ("gauge", "Number of requests processing."),
    "requests_deferred": ("gauge", "Number of requests deferred."),
    "n_busy_slots_per_decode": ("gauge", "Average number of busy slots per llama_decode() call"),
}


class MetricsController(Controller):
    @get("/metrics")
    async def metrics(self, server: SharedState) -> Response:
        st = server
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
        values = {
            "prompt_tokens_total": m.prompt_tokens_total,
            "prompt_tokens_cached_total": m.prompt_tokens_cached_total,
            "prompt_seconds_total": m.prompt_seconds_total,
            "tokens_predicted_total": m.tokens_predicted_total,
            "tokens_predicted_seconds_total": m.tokens_predicted_seconds_total,
            "n_decode_total": engine.steps,
            "n_tokens_max": m.n_tokens_max,
            "n_preemptions_total": engine.scheduler.n_preemptions,
            "n_interrupted_total": engine.n_interrupted,
            **spec_counters(engine),
            "prompt_tokens_seconds": prompt_rate,
            "predicted_tokens_seconds": gen_rate,
            "requests_processing": busy,
            "requests_deferred": engine.n_waiting,
            "n_busy_slots_per_decode": busy,
        }
        lines = []
        for name, value in values.items():
            kind, help_text = _METRICS[name]
            lines += [
                f"# HELP llamacpp:{name} {help_text}",
                f"# TYPE llamacpp:{name} {kind}",
                f"llamacpp:{name} {_fmt(value)}",
            ]
        lines += spec_per_position(engine)
        text = "\n".join(lines) + "\n"
        if st.latency is not None:  # the per-request distributions (llama_server.latency)
            text += st.latency.exposition()
        return Response(
            text,
            media_type="text/plain; version=0.0.4",
            headers={"Process-Start-Time-Unix": str(int(st.started))},
        )
