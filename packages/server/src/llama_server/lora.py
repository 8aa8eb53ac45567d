"""LoRA adapters for llama-server: the command-line flags, the global scales and a request's `lora` field
(endpoints.md §21).

`--lora FNAME[,FNAME...]` loads adapters at scale 1, `--lora-scaled FNAME:SCALE[,...]` at their own scale,
`--lora-init-without-apply` loads every one at scale 0. Ids are the order of loading (the `--lora` files,
then the `--lora-scaled` ones). Requests without a `lora` field run under the global scales
(`POST /lora-adapters` changes them); a request's `[{"id", "scale"}]` list overrides them for that request,
adapters it leaves out at 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from .errors import ApiError

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["global_scales", "lora_from_flags", "request_scales", "set_global_scales"]


def lora_from_flags(
    lora: tuple[str, ...], scaled: tuple[str, ...], without_apply: bool
) -> tuple[tuple[str, float], ...]:
    """(path, initial scale) per adapter from the flags' values (each may hold a comma-separated list)."""
    out = [(p, 1.0) for v in lora for p in v.split(",") if p]
    for v in scaled:
        for item in v.split(","):
            parts = item.split(":")
            if len(parts) != 2:
                raise click.UsageError("lora-scaled format: FNAME:SCALE")
            try:
                out.append((parts[0], float(parts[1])))
            except ValueError:
                raise click.UsageError(f"lora-scaled: invalid scale {parts[1]!r}") from None
    return tuple((p, 0.0 if without_apply else s) for p, s in out)


def global_scales(st: ServerState) -> list[float]:
    """The scales requests without a `lora` field use (the flags' until POST /lora-adapters)."""
    if st.lora_scales is None:
        st.lora_scales = [s for _, s in st.config.lora]
    return st.lora_scales


def _scales(entries: list[Any], n: int) -> list[float]:
    """llama-server's parse_lora_request then construct_lora_list: each listed id gets its scale (a later
    entry wins), every other adapter 0; entries with an unknown id are ignored."""
    out = [0.0] * n
    for e in entries:
        e = e if isinstance(e, dict) else {}
        i, s = e.get("id", -1), e.get("scale", 0.0)
        if isinstance(i, bool) or not isinstance(i, int):
            i = -1
        if isinstance(s, bool) or not isinstance(s, int | float):
            s = 0.0
        if 0 <= i < n:
            out[i] = float(s)
    return out


def set_global_scales(st: ServerState, body: Any) -> None:
    """POST /lora-adapters: the new global scales (adapters not listed: 0)."""
    if not isinstance(body, list):
        raise ApiError("Request body must be an array")
    st.lora_scales = _scales(body, len(st.config.lora))


def request_scales(st: ServerState, value: Any) -> tuple[float, ...]:
    """The engine's scales for a request whose `lora` field is `value` (None or []: the global ones)."""
    if value is None or value == []:
        return tuple(global_scales(st))
    if not isinstance(value, list):
        raise ApiError("Error: 'lora' must be an array of objects with 'id' and 'scale' fields")
    return tuple(_scales(value, len(st.config.lora)))
