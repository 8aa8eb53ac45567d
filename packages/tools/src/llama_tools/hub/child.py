"""Download mode of a router child (`LLAMA_SERVER_CHILD_MODE=download`, router.md §7): download
`LLAMA_ARG_HF_REPO` (or `LLAMA_ARG_MODEL_URL`) into the cache, reporting progress on stdout as
`cmd_child_to_router:state:{"state":"downloading",...}` lines (one per 100 ms per file, first and last
always), then the result, then wait for the router's exit command. The exit command before the end
cancels the download; EOF on stdin (the router died) ends the process with status 1."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any

from .download import download_model
from .http import HubError

__all__ = ["is_download_child", "run_download_child"]

CMD_PREFIX = "cmd_child_to_router:state:"
EXIT_COMMAND = b"cmd_router_to_child:exit"
log = logging.getLogger("llama_tools.hub")


def is_download_child() -> bool:
    env = os.environ
    return bool(env.get("LLAMA_SERVER_ROUTER_PORT")) and env.get("LLAMA_SERVER_CHILD_MODE") == "download"


class _Reporter:
    def __init__(self) -> None:
        sys.stdout.flush()
        self.out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        os.dup2(2, 1)  # anything else printed goes to the log
        self.lock = threading.Lock()
        self.last: dict[str, float] = {}

    def send(self, payload: dict[str, Any]) -> None:
        line = CMD_PREFIX + json.dumps({"state": "downloading", "payload": payload}, separators=(",", ":"))
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()

    def progress(self, url: str, done: int, total: int) -> None:
        now = time.monotonic()
        first = url not in self.last
        if first or done == total or now - self.last[url] >= 0.1:
            self.last[url] = now
            self.send({"url": url, "downloaded": done, "total": total})


def run_download_child() -> int:
    """The whole download-mode process; returns its exit status."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    spec = os.environ.get("LLAMA_ARG_HF_REPO") or os.environ.get("LLAMA_ARG_MODEL_URL") or ""
    reporter = _Reporter()
    cancel, exit_asked = threading.Event(), threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin.buffer:
            if EXIT_COMMAND in line:
                cancel.set()
                exit_asked.set()
                return
        os._exit(1)

    threading.Thread(target=read_stdin, name="download-router-in", daemon=True).start()
    ok = False
    try:
        got = download_model(
            spec,
            hf_file=os.environ.get("LLAMA_ARG_HF_FILE", ""),
            token=os.environ.get("HF_TOKEN") or None,
            progress=reporter.progress,
            cancel=cancel,
        )
        log.info("downloaded %s to %s", got.name, got.path)
        ok = True
    except HubError as e:
        log.error("download failed for model name=%s: %s", spec, e)
    except OSError as e:
        log.error("download failed for model name=%s: %s", spec, e)
    reporter.send({"result": "download_finished" if ok else "download_failed"})
    exit_asked.wait()  # the router answers the result with the exit command
    log.info("download completed %s", "successfully" if ok else "with errors")
    return 0
