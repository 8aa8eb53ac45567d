"""`llama-server -hf user/repo[:quant]` (and `-hff`, `-hft`, `--offline`, `-mu URL`): the model file to
load, downloaded into the cache first when needed, with progress lines on stderr."""

from __future__ import annotations

import sys
import time

from .download import Downloaded, download_model

__all__ = ["download_for_server"]


def download_for_server(
    spec: str, hf_file: str = "", token: str | None = None, offline: bool = False
) -> Downloaded:
    """Raises HubError (its message is what to show)."""
    shown: dict[str, tuple[int, float]] = {}

    def progress(url: str, done: int, total: int) -> None:
        pct = 100 * done // total if total else 0
        last_pct, last_t = shown.get(url, (-100, 0.0))
        now = time.monotonic()
        if done == total or pct >= last_pct + 10 or now - last_t > 5:
            shown[url] = (pct, now)
            name = url.rsplit("/", 1)[-1].split("?", 1)[0]
            print(f"llama-server: downloading {name}: {done}/{total or '?'} bytes ({pct}%)", file=sys.stderr)

    # the projector is not fetched: this server loads text models only
    return download_model(
        spec, hf_file=hf_file, token=token, offline=offline, mmproj=False, progress=progress
    )
