"""The running side of the catalogue: one `Instance` per entry, the FIFO load queue with LRU eviction
(router.md §6), the status events behind `/models/sse` (§5.8) and catalogue reloads (§5.7)."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .catalogue import CatalogueError, Entry, build_catalogue
from .child import ChildProcess
from .config import RouterConfig
from .keep_alive import effective_keep_alive
from .replicas import Replica, replicas_of

__all__ = ["RUNNING", "Instance", "LoadError", "ModelManager"]

log = logging.getLogger("llama_router")

RUNNING = frozenset({"loading", "loaded", "sleeping"})


class LoadError(Exception):
    """A request that cannot be served by a model: (HTTP status, message)."""

    def __init__(self, code: int, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.kind = kind or ("invalid_request_error" if code < 500 else "server_error")


@dataclass(slots=True)
class Instance:
    """An entry and its child, if any."""

    entry: Entry
    status: str = "unloaded"
    child: ChildProcess | None = None
    port: int = 0
    key: str = ""
    args: list[str] = field(default_factory=list)
    in_flight: int = 0
    last_used: float = 0.0
    stopping: bool = False
    exit_code: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    architecture: dict[str, list[str]] | None = None
    progress: dict[str, Any] | None = None
    load_seq: int = 0  # bumped when a load attempt ends (loaded or failed): waiters see which
    load_failed: bool = False
    crashes: int = 0
    next_spawn: float = 0.0
    loaded_at: float = 0.0
    replicas: list[Replica] = field(default_factory=list)
    unload_at: float | None = None  # time.time() after which an idle model is unloaded (keep-alive)
    pool: Any = None  # its replicas on a Ray cluster (llama_router.cluster.Pool), for an entry with some

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def running(self) -> bool:
        return self.status in RUNNING

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(slots=True)
class _Waiting:
    waiters: int = 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ModelManager:
    """All instances. Every state change happens on the event loop and wakes `self.changed` waiters."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.instances: dict[str, Instance] = {}
        self.aliases: dict[str, str] = {}
        self.queue: OrderedDict[str, _Waiting] = OrderedDict()
        self.changed = asyncio.Condition()
        self.subscribers: set[asyncio.Queue[dict[str, Any] | None]] = set()
        self.fake_timing = bool(os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING"))
        self.reloading = False
        self._bg: set[asyncio.Task[Any]] = set()
        self.cluster: Any = None  # llama_router.cluster.Cluster under --ray
        self.set_catalogue(self._build_catalogue(startup=True))

    # -- catalogue -----------------------------------------------------------------------------------

    def _build_catalogue(self, startup: bool) -> dict[str, Entry]:
        c = self.config
        entries = build_catalogue(
            c.models_dir, c.models_preset, c.cli_options, startup=startup, remote_keys=c.remote_api_keys
        )
        replicated = [e.name for e in entries.values() if e.cluster]
        if replicated and not c.ray:
            raise CatalogueError(
                f"preset '{replicated[0]}' asks for replicas on a Ray cluster: start the router with "
                "--ray auto|ADDRESS|local"
            )
        return entries

    def set_catalogue(self, entries: dict[str, Entry]) -> None:
        for name, entry in entries.items():
            inst = self.instances.get(name)
            if inst is None:
                inst = self.instances[name] = Instance(entry)
                if entry.remote:
                    inst.replicas = replicas_of(entry.remote, entry.remote_keys)
                    inst.status = "loaded"
            elif entry.cluster or inst.entry.cluster:  # its pool follows the entry (Cluster.sync)
                inst.entry = entry
            elif entry.remote and inst.entry.remote and inst.child is None:  # new URLs or keys take effect
                if entry.identity() != inst.entry.identity():
                    inst.replicas = replicas_of(entry.remote, entry.remote_keys)
                inst.entry = entry
            elif not inst.running and inst.status != "downloading":
                inst.entry, inst.architecture, inst.exit_code = entry, None, None
                if inst.status == "downloaded":  # the finished download is now a cache entry
                    inst.status, inst.args, inst.progress = "unloaded", [], None
            else:
                inst.entry.aliases, inst.entry.tags, inst.entry.hidden = (
                    entry.aliases,
                    entry.tags,
                    entry.hidden,
                )
                inst.entry.pinned, inst.entry.keep_alive = entry.pinned, entry.keep_alive
        self.aliases = {}
        for inst in self.instances.values():
            for a in inst.entry.aliases:
                if a in self.instances or a in self.aliases:
                    log.warning("alias '%s' of '%s' conflicts with another model: skipped", a, inst.name)
                    continue
                self.aliases[a] = inst.name

    def resolve(self, name: str) -> Instance | None:
        inst = self.instances.get(name)
        if inst is None and name in self.aliases:
            inst = self.instances.get(self.aliases[name])
        return inst

    async def reload(self) -> None:
        """Re-read every source; restart running models whose options changed (§5.7)."""
        self.reloading = True
        try:
            entries = self._build_catalogue(startup=False)
            stops = []
            for name, inst in list(self.instances.items()):
                new = entries.get(name)
                if inst.running and (new is None or new.identity() != inst.entry.identity()):
                    stops.append(self.stop(inst))
            await asyncio.gather(*stops)
            for name, inst in list(self.instances.items()):
                if name not in entries and inst.status != "downloading" and not inst.running:
                    del self.instances[name]
            self.set_catalogue(entries)
            if self.cluster is not None:
                self.cluster.sync()
        finally:
            self.reloading = False
        self.broadcast("*", "models_reload")
        await self.notify()

    # -- events --------------------------------------------------------------------------------------

    def broadcast(self, model: str, event: str, data: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"model": model, "event": event}
        if data is not None:
            msg["data"] = data
        for q in list(self.subscribers):
            q.put_nowait(msg)

    def set_remote_status(self, inst: Instance, status: str) -> None:
        self._set_status(inst, status)

    def _set_status(self, inst: Instance, status: str, **extra: Any) -> None:
        inst.status = status
        self.broadcast(inst.name, "status_change", {"status": status, **extra})
        self._spawn(self.notify())

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()
        self._schedule()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # -- children ------------------------------------------------------------------------------------

    def _start_child(self, inst: Instance) -> None:
        """Begin loading `inst`: status `loading` at once, the process starts in the background."""
        inst.port, inst.key = _free_port(), secrets.token_urlsafe(24)
        inst.args = [
            *self.config.server_command,
            *inst.entry.child_args(),
            "--host", "127.0.0.1",
            "--port", str(inst.port),
            "--alias", inst.name,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_MODELS_")}
        env.pop("LLAMA_ARG_API_KEY_FILE", None)
        env |= {"LLAMA_SERVER_ROUTER_PORT": str(self.config.port), "LLAMA_API_KEY": inst.key}
        inst.status, inst.exit_code, inst.info, inst.progress = "loading", None, {}, None
        inst.load_failed, inst.stopping = False, False
        inst.last_used = time.monotonic()
        self.broadcast(inst.name, "model_status", {"status": "loading"})
        child = ChildProcess(
            inst.args, env, str(inst.port), lambda s, p: self._on_state(inst, s, p), lambda c: None
        )
        inst.child = child
        self._spawn(self._launch(inst, child))

    async def _launch(self, inst: Instance, child: ChildProcess) -> None:
        if self.fake_timing:  # tests widen race windows with it (router.md §7)
            await asyncio.sleep(2)
        if inst.child is not child:
            return
        try:
            await child.start()
        except OSError as e:
            log.error("cannot start the child of %s: %s", inst.name, e)
            self._on_exit(inst, child, 127)
            return
        log.info("%s: started child pid %s on port %d", inst.name, child.pid, inst.port)
        self._spawn(self._watch(inst, child))

    async def _watch(self, inst: Instance, child: ChildProcess) -> None:
        await child.exited.wait()
        self._on_exit(inst, child, child.returncode if child.returncode is not None else -1)

    def _on_state(self, inst: Instance, state: str, payload: dict[str, Any]) -> None:
        if state == "loading":
            inst.progress = payload
            self._set_status(inst, "loading", progress=payload)
        elif state == "ready":
            extra: dict[str, Any] = {}
            if payload:
                inst.info = payload
                arch = payload.get("architecture")
                if isinstance(arch, dict):
                    inst.architecture = arch
                extra["info"] = payload
            first = inst.status == "loading"
            inst.loaded_at = time.monotonic()
            if first:
                inst.load_seq += 1
                if inst.in_flight == 0:  # loaded with nothing to serve (`POST /models/load`): the clock runs
                    self.arm(inst, None)
            self._set_status(inst, "loaded", **extra)
        elif state == "sleeping":
            self._set_status(inst, "sleeping")
        else:
            log.warning("%s: unknown child state %r", inst.name, state)

    def _on_exit(self, inst: Instance, child: ChildProcess, code: int) -> None:
        if inst.child is not child:
            return
        was = inst.status
        inst.child, inst.stopping, inst.exit_code = None, False, code
        inst.unload_at = None
        if was == "loading":
            inst.load_failed = True
            inst.load_seq += 1
        if code != 0 and not child.asked:
            # a crash: respawn on the next request, waiting longer each time it keeps dying
            stable = was == "loaded" and time.monotonic() - inst.loaded_at > 30
            inst.crashes = 1 if stable else inst.crashes + 1
            delay = 0.0 if inst.crashes <= 1 else min(0.5 * 2 ** (inst.crashes - 2), 30.0)
            inst.next_spawn = time.monotonic() + delay
            log.warning("%s: child exited with status %d (was %s)", inst.name, code, was)
        elif code == 0:
            inst.crashes = 0
        self._set_status(inst, "unloaded", exit_code=code)

    async def stop(self, inst: Instance) -> None:
        """Stop the child and wait for its exit: a loading child is killed at once (§5.4)."""
        child = inst.child
        if child is None:
            return
        inst.stopping = True
        child.asked = True
        await child.stop(inst.entry.stop_timeout, graceful=inst.status != "loading")

    # -- the queue (§6) -------------------------------------------------------------------------------

    def _running_count(self) -> int:
        return sum(
            1 for i in self.instances.values() if i.running and not (i.entry.remote or i.entry.cluster)
        )

    def _capacity(self) -> int | None:
        m = self.config.models_max
        return m if m > 0 else None

    def _schedule(self) -> None:
        """Evict idle LRU models while queued entries outnumber the slots free or being freed."""
        cap = self._capacity()
        if cap is None or not self.queue:
            return
        wanted = [n for n in self.queue if not self.instances[n].running]
        stopping = sum(1 for i in self.instances.values() if i.running and i.stopping)
        need = len(wanted) - (cap - self._running_count()) - stopping
        while need > 0:
            victim = self._victim(set(self.queue))
            if victim is None:
                return
            victim.stopping = True
            self._spawn(self.stop(victim))
            need -= 1

    def _victim(self, keep: set[str]) -> Instance | None:
        idle = [
            i
            for i in self.instances.values()
            if i.status in ("loaded", "sleeping")
            and not (i.stopping or i.entry.remote or i.entry.cluster or i.entry.pinned or i.in_flight)
            and i.name not in keep
        ]
        return min(idle, key=lambda i: i.last_used) if idle else None

    def queued_waiters(self) -> int:
        return sum(w.waiters for w in self.queue.values())

    async def acquire(self, inst: Instance, autoload: bool, post: bool = True) -> None:
        """Wait until `inst` is loaded (loading it with autoload), then count a request in flight.
        Cancelling the wait (client gone) leaves the queue."""
        if inst.status in ("loaded", "sleeping") and not inst.stopping and not self.reloading:
            self._take(inst, post)
            return
        if not autoload and not (inst.running and not inst.stopping):
            raise LoadError(400, "model is not loaded")
        if self.queued_waiters() >= self.config.max_waiting:
            raise LoadError(503, "too many requests waiting for a model, retry later", "unavailable_error")
        slot = self.queue.setdefault(inst.name, _Waiting())
        slot.waiters += 1
        seq = None
        try:
            self._schedule()
            async with self.changed:
                while True:
                    if inst.status in ("loaded", "sleeping") and not inst.stopping and not self.reloading:
                        self._take(inst, post)
                        return
                    if seq is not None and inst.load_seq != seq and inst.load_failed:
                        raise LoadError(500, f"model name={inst.name} failed to load")
                    if not inst.running and not self.reloading and self._may_spawn(inst):
                        if inst.next_spawn > time.monotonic():
                            await asyncio.sleep(inst.next_spawn - time.monotonic())
                            continue
                        seq = inst.load_seq
                        self._start_child(inst)
                        continue
                    if inst.status == "loading" and seq is None:
                        seq = inst.load_seq
                    await self.changed.wait()
        finally:
            slot.waiters -= 1
            if slot.waiters <= 0 and self.queue.get(inst.name) is slot:
                del self.queue[inst.name]
            self._spawn(self.notify())

    def _may_spawn(self, inst: Instance) -> bool:
        """A free slot, given to queued entries in arrival order."""
        cap = self._capacity()
        if cap is None:
            return True
        free = cap - self._running_count()
        order = [n for n in self.queue if not self.instances[n].running]
        return inst.name in order[: max(free, 0)]

    def _take(self, inst: Instance, post: bool) -> None:
        inst.in_flight += 1
        if post:
            inst.last_used = time.monotonic()

    def release(self, inst: Instance, keep_alive: float | None = None) -> None:
        """A request ended; `keep_alive`: the seconds it asked the model to stay loaded (None: default)."""
        inst.in_flight -= 1
        self.arm(inst, keep_alive)
        if inst.in_flight == 0:
            self._spawn(self.notify())
            if inst.unload_at is not None and inst.unload_at <= time.time():
                self.expire()

    # -- keep-alive (llama_router.keep_alive) -----------------------------------------------------------

    def arm(self, inst: Instance, requested: float | None) -> None:
        """Start the model's keep-alive clock: the request's value, the preset's, else the router's."""
        default = inst.entry.keep_alive if inst.entry.keep_alive is not None else self.config.keep_alive
        keep = effective_keep_alive(requested, default, self.config.keep_alive_max)
        inst.unload_at = None if keep < 0 or inst.entry.pinned else time.time() + keep

    def expire(self) -> None:
        """Unload every idle model whose keep-alive has run out (pinned ones never are)."""
        now = time.time()
        for inst in self.instances.values():
            if (
                inst.unload_at is not None
                and inst.unload_at <= now
                and inst.status in ("loaded", "sleeping")
                and not (inst.stopping or inst.in_flight or inst.entry.pinned or inst.entry.remote)
                and inst.pool is None
            ):
                log.info("%s: unloading, idle past its keep-alive", inst.name)
                inst.unload_at = None
                inst.stopping = True
                self._spawn(self.stop(inst))

    async def keep_alive_loop(self, interval: float = 0.5) -> None:
        """Check the keep-alive clocks every `interval` seconds (the app's lifespan runs it)."""
        while True:
            await asyncio.sleep(interval)
            self.expire()

    # -- management routes ---------------------------------------------------------------------------

    async def load(self, inst: Instance) -> None:
        """POST /models/load: evict one LRU idle model when full, wait for it, spawn, return."""
        if inst.pool is not None:
            inst.pool.load()
            return
        if inst.running and not inst.stopping:
            raise LoadError(400, "model is already running")
        cap = self._capacity()
        if cap is not None and self._running_count() >= cap:
            victim = self._victim({inst.name})
            if victim is None:
                raise LoadError(500, "model limit reached, try again later")
            await self.stop(victim)
        self._start_child(inst)

    async def unload(self, inst: Instance) -> None:
        if inst.pool is not None:
            inst.pool.unload()
            return
        if not inst.running:
            raise LoadError(400, "model is not running")
        self._spawn(self.stop(inst))

    async def start_up(self) -> None:
        """Load the `load-on-startup` models."""
        first = [i for i in self.instances.values() if i.entry.load_on_startup and not i.entry.cluster]
        cap = self._capacity()
        if cap is not None and len(first) > cap:
            raise ValueError(f"{len(first)} models have load-on-startup, more than --models-max {cap}")
        for inst in first:
            self._start_child(inst)

    async def shutdown(self) -> None:
        for q in list(self.subscribers):
            q.put_nowait(None)
        if self.cluster is not None:
            await self.cluster.close()
        await asyncio.gather(
            *(self.stop(i) for i in self.instances.values() if i.child), return_exceptions=True
        )
