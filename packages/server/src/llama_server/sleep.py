"""Sleep mode (`--sleep-idle-seconds N`, router.md §8): after N seconds without a queued task the
engine (weights, KV cache) is released; chat templates and settings stay.

`sleep_gate(app, state)` wraps the router, inside the edge (CORS, API key). While asleep, `GET /health`,
`GET /props` (its snapshot, `is_sleeping: true`), `GET /models`, `/v1/models` and `GET /metrics` (the
last awake figures; each scrape zeroes the throughput gauges) answer without waking; every other request
wakes the server and waits for the reload (same parameters). Token counting, tokenize, detokenize,
apply-template and `POST /props` wake it but do not reset the idle clock; metrics scrapes neither wake it
nor reset the clock. A router child reports `sleeping`, and `ready` with an empty payload once awake.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
import re
import threading
import time
from typing import Any

from .state import ServerState, release_heap

__all__ = ["SleepGate", "sleep_gate"]

log = logging.getLogger("llama_server")

SNAPSHOT_PATHS = ("/props", "/models", "/v1/models", "/metrics")
NO_WAKE = frozenset({"/health", "/v1/health", *SNAPSHOT_PATHS})
NO_RESET = frozenset(
    {"/tokenize", "/detokenize", "/apply-template", "/props", "/v1/messages/count_tokens",
     "/chat/completions/input_tokens", "/v1/chat/completions/input_tokens", "/responses/input_tokens",
     "/v1/responses/input_tokens"}
)  # fmt: skip
_GAUGES = re.compile(rb"^(llamacpp:(?:prompt|predicted)_tokens_seconds) \S+$", re.MULTILINE)


class SleepGate:
    """The ASGI wrapper that counts activity, puts the engine to sleep and wakes it."""

    def __init__(self, app: Any, litestar: Any, state: ServerState, idle_seconds: float) -> None:
        self.app = app
        self.litestar = litestar
        self.state = state
        self.idle = idle_seconds
        self.phase = "awake"  # awake | falling | asleep | waking
        self.active = 0  # requests inside the gate that need the engine
        self.last = time.monotonic()  # the idle clock: the last task's start or end
        self.snapshots: dict[str, tuple[int, list[Any], bytes]] = {}
        self.steps = 0  # decode steps of earlier engines: n_decode_total stays a counter
        self._transition: asyncio.Future[None] | None = None
        self._seen_ready = False
        threading.Thread(target=self._monitor, name="llama-server-sleep", daemon=True).start()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    # -- requests --------------------------------------------------------------------------------------

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = self._route(scope["path"]), scope["method"]
        if (path in NO_WAKE and method == "GET") or _static(path, method):
            if self.phase != "awake" and path in self.snapshots:
                await self._replay(path, send)
            else:
                await self.app(scope, receive, send)
            return
        resets = path not in NO_RESET
        self.active += 1
        if resets:
            self.last = time.monotonic()
        try:
            await self._ensure_awake()
            await self.app(scope, receive, send)
        finally:
            self.active -= 1
            if resets:
                self.last = time.monotonic()

    def _route(self, path: str) -> str:
        prefix = self.state.config.api_prefix
        return path[len(prefix) :] or "/" if prefix and path.startswith(prefix) else path

    async def _ensure_awake(self) -> None:
        while self.phase != "awake":
            if self.phase == "asleep":
                self.phase = "waking"
                self._transition = asyncio.ensure_future(self._wake_up())
            assert self._transition is not None
            await asyncio.shield(self._transition)

    async def _replay(self, path: str, send: Any) -> None:
        status, headers, body = self.snapshots[path]
        if path == "/metrics":  # the rates were reported once: the next scrape shows none
            self.snapshots[path] = (status, headers, _GAUGES.sub(rb"\1 0", body))
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    # -- falling asleep ----------------------------------------------------------------------------

    def _monitor(self) -> None:
        st = self.state
        while True:
            time.sleep(min(0.25, self.idle / 4))
            if not st.ready.is_set() or st.loop is None or st.draining:
                continue
            if not self._seen_ready:  # the idle clock starts once the model is loaded
                self._seen_ready, self.last = True, time.monotonic()
                continue
            if self.phase == "awake" and not self.active and time.monotonic() - self.last >= self.idle:
                try:
                    asyncio.run_coroutine_threadsafe(self._fall_asleep(), st.loop).result()
                except Exception:
                    log.exception("falling asleep failed")

    async def _fall_asleep(self) -> None:
        st = self.state
        engine = st.engine
        if self.phase != "awake" or self.active or engine is None or time.monotonic() - self.last < self.idle:
            return
        if engine.n_waiting or any(s.is_processing for s in engine.slots()):
            self.last = time.monotonic()
            return
        loop = asyncio.get_running_loop()
        self.phase = "falling"
        self._transition = loop.create_future()
        try:
            self.snapshots = {p: await self._capture(p) for p in SNAPSHOT_PATHS}
            self.steps += engine.steps
            st.engine = None
            await asyncio.to_thread(engine.shutdown)
            del engine
            release_heap()  # the frozen model's objects (settle_heap) become collectable again
            gc.collect()
            log.info("sleeping after %.0f s idle: model released", self.idle)
            self.phase = "asleep"
            _notify_router("sleeping")
        except BaseException:
            if st.engine is None:  # released: waking reloads it
                self.phase = "asleep"
            else:
                self.phase = "awake"
            raise
        finally:
            self._transition.set_result(None)

    async def _capture(self, path: str) -> tuple[int, list[Any], bytes]:
        """One GET answered by the app itself (the engine still loaded), kept for the sleep."""
        full = (self.state.config.api_prefix or "") + path
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": full, "raw_path": full.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
            "app": self.litestar, "litestar_app": self.litestar, "state": {},
        }  # fmt: skip
        start: dict[str, Any] = {}
        body: list[bytes] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                start.update(msg)
            else:
                body.append(msg.get("body", b""))

        await self.app(scope, receive, send)
        raw = b"".join(body)
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        if path == "/props" and start.get("status") == 200:
            data = json.loads(raw)
            data["is_sleeping"] = True
            raw = json.dumps(data).encode()
        return int(start.get("status", 500)), headers, raw

    # -- waking ----------------------------------------------------------------------------------------

    async def _wake_up(self) -> None:
        st = self.state
        t0 = time.perf_counter()
        cfg = st.config
        st.config = dataclasses.replace(cfg, warmup=False)  # this process has every kernel ready already
        try:  # the same parameters; a failure ends the process, as at start
            await asyncio.to_thread(st._load)
        finally:
            st.config = cfg
        if st.engine is None:
            self.phase = "asleep"
            raise RuntimeError(st.load_error or "the model could not be reloaded")
        st.engine.steps += self.steps
        self.steps = 0
        self.snapshots = {}
        self.last = time.monotonic()
        log.info("woke up: model reloaded in %.1f s", time.perf_counter() - t0)
        self.phase = "awake"
        _notify_router("ready")


def _static(path: str, method: str) -> bool:
    """The web UI's files: served from disk, they need no model."""
    return method == "GET" and (path in ("/", "/index.html") or "." in path.rsplit("/", 1)[-1])


def _notify_router(state: str) -> None:
    from .child import current_channel

    channel = current_channel()
    if channel is not None:
        channel.send(state, {})


def sleep_gate(app: Any, state: ServerState) -> Any:
    """`app.asgi_handler` wrapped in a SleepGate when `--sleep-idle-seconds` is set, else unchanged."""
    seconds = getattr(state.config, "sleep_idle_seconds", -1)
    if seconds is None or seconds <= 0:
        return app.asgi_handler
    return SleepGate(app.asgi_handler, app, state, float(seconds))
