"""Replicas on a Ray cluster (`llama-router --ray auto|ADDRESS|local`).

A preset entry with `replicas = N` (or `min-replicas`/`max-replicas`) is served by Ray actors placed on
the cluster's nodes (`ReplicaActor`: one `llama-server` child each), named `<model>/<i>` and detached, so a
restarted router finds the live ones again. Per entry a `Pool` keeps the members in step with the wanted
count: it polls each actor for its state and address, balances requests over the loaded ones (fewest in
flight; ties: the replica that served the conversation last), scales by queue depth as Ray Serve's
`target_ongoing_requests` does, and replaces members whose child exited. Ray restarts an actor whose
node died on a live node (`max_restarts=-1`); until then the member is out of the balance and its
in-flight streams end with an error event.

Ray is optional (`pip install 'llama-router[ray]'`) and imported only when `--ray` is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import httpx

from . import options as opts
from .replicas import Replica

if TYPE_CHECKING:
    from .models import Instance, ModelManager

__all__ = [
    "CLUSTER_KEYS",
    "Cluster",
    "ClusterError",
    "ClusterSpec",
    "LocalCluster",
    "Pool",
    "ScaleState",
    "conversation_key",
    "decide",
    "parse_cluster",
]

log = logging.getLogger("llama_router")

CLUSTER_KEYS = frozenset(
    {"replicas", "min-replicas", "max-replicas", "num-cpus", "memory", "num-gpus", "target-ongoing-requests",
     "upscale-delay"}
)  # fmt: skip
POLL = 0.5  # seconds between two looks at the members
INFO_TIMEOUT = 3.0  # an actor that does not answer within this is out of the balance
PENDING_WARN = 30.0  # a replica not placed after this long is logged (the cluster has no room for it)
AFFINITY = 4096  # conversations remembered per model
# nodes of `--ray local` notice a dead node within ~1.5 s (Ray's defaults take ~15-30 s)
FAST_HEALTH = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_initial_delay_ms": "0",
}


class ClusterError(ValueError):
    """A cluster that cannot be used, or a preset whose replica settings are wrong."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What a preset says about an entry's replicas."""

    min_replicas: int = 1
    max_replicas: int = 1
    num_cpus: float = 1.0
    memory: int = 0  # bytes Ray reserves per replica (0: none)
    num_gpus: float = 0.0
    target: float = 2.0  # requests in flight per replica the autoscaler aims at
    upscale_delay: float = 30.0  # seconds above the target before a replica is added
    sleep_idle: float = -1.0  # seconds without requests before scaling down to min (< 0: never)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


def parse_size(value: str) -> int:
    """Bytes from `123`, `512M`, `4G`, `4GiB` (binary units)."""
    m = _SIZE.match(value)
    if not m:
        raise ValueError(f"not a size: {value!r} (bytes, or a number with K, M, G or T)")
    unit = (m[2] or "B")[0].upper()
    return int(float(m[1]) * 1024 ** "BKMGT".index(unit))


def parse_cluster(name: str, special: dict[str, str]) -> ClusterSpec | None:
    """The entry's replica settings (None when it names none). Raises ClusterError."""
    given = CLUSTER_KEYS & special.keys()
    if not given:
        return None

    def number(key: str, default: float, kind: type = float, low: float = 0.0) -> Any:
        if key not in special:
            return default
        try:
            v = kind(special[key])
        except ValueError:
            raise ClusterError(f"preset '{name}': {key} = {special[key]!r} is not a number") from None
        if v < low:
            raise ClusterError(f"preset '{name}': {key} must be >= {low:g}")
        return v

    if "replicas" in special and {"min-replicas", "max-replicas"} & special.keys():
        raise ClusterError(f"preset '{name}': give replicas, or min-replicas/max-replicas, not both")
    n = number("replicas", 1, int, 1)
    low = number("min-replicas", n if "replicas" in special else 1, int, 0)
    high = number("max-replicas", n if "replicas" in special else max(low, 1), int, 1)
    if low > high:
        raise ClusterError(f"preset '{name}': min-replicas {low} is more than max-replicas {high}")
    try:
        memory = parse_size(special["memory"]) if "memory" in special else 0
    except ValueError as e:
        raise ClusterError(f"preset '{name}': memory: {e}") from None
    return ClusterSpec(
        min_replicas=low,
        max_replicas=high,
        num_cpus=number("num-cpus", 1.0),
        memory=memory,
        num_gpus=number("num-gpus", 0.0),
        target=number("target-ongoing-requests", 2.0, float, 0.001),
        upscale_delay=number("upscale-delay", 30.0),
    )


def with_sleep_idle(spec: ClusterSpec, options: dict[str, str]) -> ClusterSpec:
    """The spec with the entry's `sleep-idle-seconds` (its children's option, the command line's included)."""
    try:
        return replace(spec, sleep_idle=float(options.get("sleep-idle-seconds", "-1")))
    except ValueError:
        return spec


# -- autoscaling ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class ScaleState:
    above_since: float | None = None
    idle_since: float | None = None


def decide(spec: ClusterSpec, current: int, ongoing: int, now: float, st: ScaleState) -> tuple[int, str]:
    """The replica count wanted now and why ("" when unchanged). `ongoing`: requests in flight or waiting.

    Up: ceil(ongoing / target) replicas once the load has stayed above what `current` replicas are meant
    to take for `upscale_delay` seconds (at once from zero: a request is waiting). Down: to min once no
    request has come for `sleep_idle` seconds."""
    want = min(
        max(math.ceil(ongoing / spec.target), spec.min_replicas, 1 if ongoing else 0), spec.max_replicas
    )
    if want > current:
        st.above_since = now if st.above_since is None else st.above_since
        if current == 0 or now - st.above_since >= spec.upscale_delay:
            st.above_since = None
            if current == 0:
                return want, f"{ongoing} request(s) waiting and no replica"
            return want, (
                f"{ongoing} requests in flight or waiting for {spec.upscale_delay:g} s, "
                f"target {spec.target:g} per replica"
            )
    else:
        st.above_since = None
    if ongoing:
        st.idle_since = None
        return current, ""
    st.idle_since = now if st.idle_since is None else st.idle_since
    if spec.sleep_idle >= 0 and current > spec.min_replicas and now - st.idle_since >= spec.sleep_idle:
        return (
            spec.min_replicas,
            f"idle for {now - st.idle_since:.0f} s (sleep-idle-seconds {spec.sleep_idle:g})",
        )
    return current, ""


def conversation_key(conv: str, body: bytes) -> str:
    """What identifies a conversation for affinity: its `X-Conversation-Id`, else the start of its prompt
    (the system and first user message, or the first 1,000 characters of a prompt)."""
    if conv:
        return "c:" + conv
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return ""
    if not isinstance(data, dict):
        return ""
    head: Any = None
    if isinstance(data.get("messages"), list):
        head = data["messages"][:2]
    elif isinstance(data.get("input"), list):
        head = data["input"][:2]
    elif isinstance(text := data.get("prompt") or data.get("input"), str):
        head = text[:1000]
    if head is None:
        return ""
    return "p:" + hashlib.sha1(json.dumps(head, sort_keys=True).encode()).hexdigest()


# -- the cluster ------------------------------------------------------------------------------------------


class LocalCluster:
    """`--ray local --ray-nodes N`: N Ray nodes on loopback on this machine (a head and N-1 workers), each a
    `ray start --block` process in its own session, stopped with the router."""

    def __init__(self, nodes: int, cpus: float | None = None) -> None:
        self.nodes = max(nodes, 1)
        self.cpus = cpus if cpus is not None else float(os.cpu_count() or 1)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.address = ""
        self.temp = tempfile.mkdtemp(prefix="llama-router-ray-")

    def start(self, timeout: float = 120.0) -> str:
        ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
        if ray_bin is None:
            raise ClusterError("the `ray` command is not installed (pip install 'llama-router[ray]')")
        from .ray_replica import free_port

        port = free_port("127.0.0.1")
        self.address = f"127.0.0.1:{port}"
        env = {**os.environ, **FAST_HEALTH}
        for i in range(self.nodes):
            args = [ray_bin, "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                    f"--num-cpus={self.cpus:g}", "--object-store-memory=100000000", "--log-style=record"]  # fmt: skip
            if i == 0:
                args += [
                    "--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={self.temp}",
                ]  # fmt: skip
            else:
                args += [f"--address={self.address}"]
            args += [f"--dashboard-agent-listen-port={free_port('127.0.0.1')}",
                     f"--metrics-export-port={free_port('127.0.0.1')}"]  # fmt: skip
            log_file = open(os.path.join(self.temp, f"node-{i}.log"), "wb")  # noqa: SIM115
            self.procs.append(
                subprocess.Popen(args, env=env, stdout=log_file, stderr=log_file, start_new_session=True)
            )
            log.info(
                "ray: starting local node %d of %d (%s)", i + 1, self.nodes, "head" if i == 0 else "worker"
            )
            if i == 0:
                self._wait_port(port, timeout)
        deadline = time.monotonic() + timeout
        for i, proc in enumerate(self.procs):  # every node has joined
            path = os.path.join(self.temp, f"node-{i}.log")
            while "Ray runtime started" not in open(path, errors="replace").read():  # noqa: SIM115
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ClusterError(f"local Ray node {i + 1} did not start")
                time.sleep(0.2)
        return self.address

    def _wait_port(self, port: int, timeout: float) -> None:
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[0].poll() is not None:
                with open(os.path.join(self.temp, "node-0.log"), errors="replace") as f:
                    tail = "".join(f.readlines()[-5:])
                raise ClusterError(f"the local Ray head exited:\n{tail}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                return
            time.sleep(0.2)
        raise ClusterError("the local Ray head did not start in time")

    def stop(self) -> None:
        """Every process of every node (a node's workers keep its session)."""
        sessions = {p.pid for p in self.procs}
        for pid in _session_members(sessions):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(10)
        shutil.rmtree(self.temp, ignore_errors=True)


def _reachable(address: str, timeout: float = 5.0) -> None:
    """Raises ClusterError unless something accepts a connection at `address` (host:port of the head)."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ClusterError(f"--ray {address!r}: expected auto, local or HOST:PORT (the head's GCS address)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout).close()
    except OSError as e:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


def _session_members(sessions: set[int]) -> list[int]:
    out = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry)) in sessions:
                    out.append(int(entry))
    return out


class Cluster:
    """The router's connection to Ray and the pools of its replicated entries."""

    def __init__(self, manager: ModelManager, address: str, namespace: str, nodes: int, keep: bool) -> None:
        self.manager = manager
        self.address = address
        self.namespace = namespace
        self.nodes = nodes
        self.keep = keep  # leave the replicas running when the router exits
        self.local: LocalCluster | None = None
        self.actor_class: Any = None
        self.pools: dict[str, Pool] = {}
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(5.0))
        self._task: asyncio.Task[None] | None = None

    def begin(self) -> None:
        """On the event loop: a pool per replicated entry, and the loop that looks after them."""
        self.sync()
        self._task = asyncio.ensure_future(self._loop())

    def connect(self) -> None:
        """Join the cluster (starting it with `--ray local`). Raises ClusterError."""
        try:
            import ray
        except ImportError:
            raise ClusterError("--ray needs Ray: pip install 'llama-router[ray]'") from None
        from .ray_replica import ReplicaActor

        address = self.address
        if address == "local":
            self.local = LocalCluster(self.nodes)
            try:
                address = self.local.start()
            except BaseException:
                self.local.stop()
                raise
        log.info("ray: connecting to %s (namespace %s)", "a running cluster" if address == "auto" else address,
                 self.namespace)  # fmt: skip
        if address != "auto":
            _reachable(address)  # Ray itself retries an address nobody answers at for minutes
        try:
            ray.init(address=address, namespace=self.namespace, log_to_driver=False, logging_level=logging.WARNING,
                     configure_logging=False)  # fmt: skip
        except Exception as e:
            if self.local:
                self.local.stop()
            raise ClusterError(f"cannot connect to the Ray cluster at {address}: {e}") from None
        if self.local:
            deadline = time.monotonic() + 120
            while sum(1 for n in ray.nodes() if n["Alive"]) < self.nodes:
                if time.monotonic() > deadline:
                    raise ClusterError("the local Ray worker nodes did not join in time")
                time.sleep(0.2)
        alive = [n for n in ray.nodes() if n["Alive"]]
        log.info(
            "ray: %d node(s) alive, %g CPUs", len(alive), sum(n["Resources"].get("CPU", 0) for n in alive)
        )
        self.actor_class = ray.remote(ReplicaActor)

    def sync(self) -> None:
        """A pool for every replicated entry; a pool whose entry changed is replaced."""
        for inst in self.manager.instances.values():
            spec = inst.entry.cluster
            old = self.pools.get(inst.name)
            if spec is None:
                if old is not None:
                    self.manager._spawn(old.close(kill=True))
                    del self.pools[inst.name]
                continue
            if old is not None and old.identity == inst.entry.identity():
                old.inst = inst
                continue
            if old is not None:
                self.manager._spawn(old.close(kill=True))
            self.pools[inst.name] = inst.pool = Pool(self, inst)
        for name in [n for n in self.pools if n not in self.manager.instances]:
            self.manager._spawn(self.pools.pop(name).close(kill=True))

    def pick_node(self, pool: Pool) -> str:
        """The live node for a new replica of `pool`: the one with the fewest replicas of that model, then
        of every model, among those big enough for it ("" when none is: Ray's SPREAD decides)."""
        import ray

        spec = pool.spec
        try:
            nodes = [
                n for n in ray.nodes()
                if n["Alive"] and n["Resources"].get("CPU", 0) >= spec.num_cpus
                and n["Resources"].get("GPU", 0) >= spec.num_gpus and n["Resources"].get("memory", 0) >= spec.memory
            ]  # fmt: skip
        except Exception as e:
            log.warning("ray: cannot list the nodes (%s): Ray places the replica", e)
            return ""
        mine = Counter(m.node for m in pool.members.values())
        every = Counter(m.node for p in self.pools.values() for m in p.members.values())
        best = min(nodes, key=lambda n: (mine[n["NodeID"]], every[n["NodeID"]]), default=None)
        return str(best["NodeID"]) if best else ""

    async def _loop(self) -> None:
        first = True
        while True:
            for pool in list(self.pools.values()):
                try:
                    await pool.tick(adopt=first or not pool.adopted)
                except Exception:
                    log.exception("ray: %s: the replica check failed", pool.inst.name)
            first = False
            await asyncio.sleep(POLL)

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.keep or self.local:
            await asyncio.gather(*(p.close(kill=True) for p in self.pools.values()), return_exceptions=True)
        else:
            log.info("ray: leaving %d replicated model(s) running (--ray-keep-replicas)", len(self.pools))
        await self.client.aclose()
        if self.actor_class is not None:
            import ray

            with contextlib.suppress(Exception):
                await asyncio.to_thread(ray.shutdown)
        if self.local:
            await asyncio.to_thread(self.local.stop)


@dataclass(slots=True)
class Member:
    """One replica slot of a pool: its actor, and what the last look at it found."""

    index: int
    actor: Any
    replica: Replica | None = None  # set while its child is (or was) serving: a new one per incarnation
    state: str = "pending"  # pending | loading | loaded | lost | exited | stopping
    info: dict[str, Any] = field(default_factory=dict)
    asking: Any = None  # the info call in flight
    asked_at: float = 0.0
    restarts: int = 0
    served_once: bool = False  # its child reached `loaded` at least once
    placed_on: str = ""  # the node it was asked to go to (its own report wins once it comes)
    created: float = field(default_factory=time.monotonic)
    warned: bool = False  # said that it waits for room

    @property
    def node(self) -> str:
        return str(self.info.get("node_id") or self.placed_on)


class Pool:
    """The replicas of one entry."""

    def __init__(self, cluster: Cluster, inst: Instance) -> None:
        assert inst.entry.cluster is not None
        self.cluster = cluster
        self.inst = inst
        self.spec = with_sleep_idle(inst.entry.cluster, inst.entry.options)
        self.identity = inst.entry.identity()
        self.members: dict[int, Member] = {}
        self.desired = self.spec.min_replicas
        self.scale = ScaleState()
        self.waiting = 0
        self.held = False  # unloaded by request: stays at 0 until a request comes
        self.adopted = False
        self.failures = 0
        self.failed_message = ""
        self.fail_seq = 0  # bumped when a replica's child exits: requests waiting for one then fail
        self.next_create = 0.0
        self.affinity: OrderedDict[str, str] = OrderedDict()
        self.news = (
            asyncio.Event()
        )  # set (and replaced) when a replica starts serving or fails: wakes waiters

    @property
    def manager(self) -> ModelManager:
        return self.cluster.manager

    def _tell(self) -> None:
        self.news.set()
        self.news = asyncio.Event()

    def actor_name(self, index: int) -> str:
        return f"{self.inst.name}/{index}"

    # -- balance ------------------------------------------------------------------------------------------

    def healthy(self) -> list[Replica]:
        return [
            m.replica
            for m in self.members.values()
            if m.state == "loaded" and m.replica and m.replica.healthy
        ]

    def pick(self, key: str) -> Replica | None:
        """The loaded replica with the fewest requests in flight; ties: the one that served this
        conversation last, then the one that served fewer."""
        healthy = self.healthy()
        if not healthy:
            return None
        last = self.affinity.get(key) if key else None
        best = min(healthy, key=lambda r: (r.outstanding, r.url != last, r.served))
        best.served += 1
        return best

    def replica_of(self, key: str) -> Replica | None:
        """The serving replica the conversation `key` last went to (None: none, or it is gone)."""
        url = self.affinity.get(key)
        return next((r for r in self.healthy() if r.url == url), None) if url else None

    def remember(self, key: str, replica: Replica) -> None:
        if key:
            self.affinity[key] = replica.url
            self.affinity.move_to_end(key)
            while len(self.affinity) > AFFINITY:
                self.affinity.popitem(last=False)

    def ongoing(self) -> int:
        return self.waiting + sum(m.replica.outstanding for m in self.members.values() if m.replica)

    def load(self) -> None:
        """`POST /models/load`: at least one replica (min-replicas when more)."""
        self.held = False
        self.want(max(self.spec.min_replicas, 1, self.desired), "asked by /models/load")

    def unload(self) -> None:
        """`POST /models/unload`: no replica until the next request (below min-replicas too)."""
        self.held = True
        self.want(0, "asked by /models/unload")

    def want(self, n: int, reason: str) -> None:
        """Ask for `n` replicas (within min and max unless 0 is asked for by an unload)."""
        n = min(n, self.spec.max_replicas)
        if n != self.desired:
            log.info("ray: %s: %d -> %d replica(s): %s", self.inst.name, self.desired, n, reason)
            self.desired = n
            self.scale = ScaleState()
            self._tell()

    # -- the look at the members ---------------------------------------------------------------------------

    async def tick(self, adopt: bool = False) -> None:
        if adopt:
            await self._adopt()
        ongoing = self.ongoing()
        self.held = self.held and not ongoing
        if not self.held:
            desired, why = decide(self.spec, self.desired, ongoing, time.monotonic(), self.scale)
            if why:
                self.want(desired, why)
        await asyncio.gather(*(self._look(m) for m in list(self.members.values())))
        for i in range(self.desired):
            if i not in self.members and time.monotonic() >= self.next_create:
                await self._create(i)
        for m in [m for i, m in self.members.items() if i >= self.desired]:
            if m.state != "stopping" and (m.replica is None or m.replica.outstanding == 0):
                m.state = "stopping"
                self.manager._spawn(self._remove(m, "scaled down"))
            elif m.replica is not None:
                m.replica.healthy = False  # no new request; removed once those in flight end
        self._publish()

    async def _adopt(self) -> None:
        """Find this model's replicas left running by an earlier router (named detached actors)."""
        import ray

        def find(i: int) -> Any:
            try:
                return ray.get_actor(self.actor_name(i), namespace=self.cluster.namespace)
            except ValueError:
                return None

        found = await asyncio.gather(
            *(asyncio.to_thread(find, i) for i in range(self.spec.max_replicas) if i not in self.members)
        )
        indices = [i for i in range(self.spec.max_replicas) if i not in self.members]
        for i, actor in zip(indices, found, strict=True):
            if actor is not None:
                self.members[i] = Member(i, actor)
                log.info("ray: %s: found replica %s still running", self.inst.name, self.actor_name(i))
        if self.members:
            self.desired = max(self.desired, max(self.members) + 1)
        self.adopted = True

    async def _create(self, index: int) -> None:
        entry = self.inst.entry
        spec = self.spec
        env = {k: v for k, v in os.environ.items() if k.startswith(("LLAMA_", "HF_", "NUMBA_"))}
        for k in [k for k in env if k.startswith("LLAMA_ARG_MODELS_")]:
            del env[k]
        env.pop("LLAMA_ARG_API_KEY_FILE", None)
        env.pop("LLAMA_SERVER_ROUTER_PORT", None)
        env["LLAMA_API_KEY"] = secrets.token_urlsafe(24)  # only the router can use the replica
        resources: dict[str, Any] = {"num_cpus": spec.num_cpus, "num_gpus": spec.num_gpus}
        if spec.memory:
            resources["memory"] = spec.memory
        actor_class = self.cluster.actor_class
        node = await asyncio.to_thread(self.cluster.pick_node, self)

        def make() -> Any:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            # soft: where the node lacks room, or once it died (a restart), anywhere else
            strategy = NodeAffinitySchedulingStrategy(node, soft=True) if node else "SPREAD"
            return actor_class.options(
                name=self.actor_name(index),
                namespace=self.cluster.namespace,
                lifetime="detached",
                get_if_exists=True,
                max_restarts=-1,
                max_task_retries=0,
                scheduling_strategy=strategy,
                **resources,
            ).remote(entry.name, list(self.manager.config.server_command), opts.render(entry.options), env)

        actor = await asyncio.to_thread(make)
        self.members[index] = Member(index, actor, placed_on=node)
        log.info("ray: %s: replica %s placed on node %s (num-cpus %g, memory %d, num-gpus %g)", entry.name,
                 self.actor_name(index), node[:12] or "(any)", spec.num_cpus, spec.memory, spec.num_gpus)  # fmt: skip
        self._tell()

    async def _look(self, m: Member) -> None:
        """Ask the actor what it is doing (one call in flight per member); update the member."""
        if m.state == "stopping":
            return
        if m.asking is None:
            m.asking = asyncio.wrap_future(m.actor.info.remote().future())
            m.asked_at = time.monotonic()
        done, _ = await asyncio.wait({m.asking}, timeout=0.05)
        if not done:
            if time.monotonic() - m.asked_at > INFO_TIMEOUT and m.state in ("loaded", "loading"):
                self._lose(m, "its actor does not answer (its node may be down)")
            elif m.state == "pending" and not m.warned and time.monotonic() - m.created > PENDING_WARN:
                m.warned = True
                s = self.spec
                log.warning("ray: %s: replica %s not placed after %.0f s: no live node has num-cpus %g, "
                            "memory %d, num-gpus %g free (it starts when one has)", self.inst.name,
                            self.actor_name(m.index), PENDING_WARN, s.num_cpus, s.memory, s.num_gpus)  # fmt: skip
            return
        ask, m.asking = m.asking, None
        try:
            info = ask.result()
        except Exception as e:  # its worker or node died: Ray restarts it (elsewhere), unless it was killed
            self._lose(m, f"its actor failed ({type(e).__name__})")
            if not await self._named(m.index):  # gone for good (or never started): a new one takes its place
                if m.served_once:
                    self.members.pop(m.index, None)
                else:  # its constructor failed (no llama-server on the node, ...): not at once again
                    self._failed(m, f"its actor failed: {str(e).strip()[-500:]}", [])
            return
        prev = m.info
        m.info = info
        if prev and info["pid"] != prev.get("pid"):
            m.restarts += 1
            log.warning("ray: %s: replica %s restarted on node %s (%s)", self.inst.name,
                        self.actor_name(m.index), info["node_ip"], info["node_id"][:12])  # fmt: skip
        if info["state"] == "exited":
            self._lose(m, f"its llama-server exited with status {info['exit_code']}")
            self._failed(m, f"its llama-server exited ({info.get('exit_code')})", info.get("log", []))
            return
        url = info["url"]
        if m.replica is None or m.replica.url != url:
            if m.replica is not None:
                self._lose(m, "it moved")
            m.replica = Replica(url, info.get("key", ""), healthy=False)
        if info["state"] == "loading":
            m.state = "loading"
        elif info["state"] == "loaded" and m.state != "loaded" and await self._answers(m.replica):
            m.state, m.replica.healthy, m.served_once = "loaded", True, True
            self.failures = 0
            self.failed_message = ""
            log.info("ray: %s: replica %s serving at %s on node %s", self.inst.name,
                     self.actor_name(m.index), url, info["node_id"][:12])  # fmt: skip
            self._tell()
            await self.manager.notify()

    async def _named(self, index: int) -> bool:
        """Whether the cluster still knows the actor `<model>/<index>` (a restarting one included)."""
        import ray

        def look() -> bool:
            try:
                ray.get_actor(self.actor_name(index), namespace=self.cluster.namespace)
            except ValueError:
                return False
            return True

        try:
            return await asyncio.to_thread(look)
        except Exception:  # the cluster itself does not answer: keep the member
            return True

    async def _answers(self, r: Replica) -> bool:
        try:
            resp = await self.cluster.client.get(r.url + "/health", timeout=3.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    def _lose(self, m: Member, why: str) -> None:
        """Out of the balance; the requests relayed to it end now (their streams with an error event)."""
        if m.state in ("lost", "exited"):
            return
        log.warning("ray: %s: replica %s is out: %s", self.inst.name, self.actor_name(m.index), why)
        m.state = "lost"
        if m.replica is not None:
            m.replica.healthy = False
            m.replica.lost.set()
            m.replica = None
        self._tell()

    def _failed(self, m: Member, why: str, lines: list[str]) -> None:
        """Its child exited or its actor could not start: replace the actor, waiting longer each time in a
        row that one fails before serving (0.5 s doubling to 30 s)."""
        m.state = "exited"
        self.failures = 0 if m.served_once else self.failures + 1
        self.fail_seq += 1
        self.next_create = time.monotonic() + (
            0 if self.failures <= 1 else min(0.5 * 2 ** (self.failures - 2), 30)
        )
        tail = "".join("\n  " + line for line in lines[-10:])
        self.failed_message = f"model name={self.inst.name} failed to load"
        log.warning("ray: %s: replica %s: %s%s", self.inst.name, self.actor_name(m.index), why,
                    f"; its last lines:{tail}" if tail else "")  # fmt: skip
        self.members.pop(m.index, None)
        self.manager._spawn(self._kill(m.actor))
        if not m.served_once and not self.healthy():  # as a child that fails to load: none until asked again
            self.held = True
            self.want(0, "its replica failed before serving; the next request tries again")
        self._tell()

    async def _remove(self, m: Member, why: str) -> None:
        log.info("ray: %s: removing replica %s (%s)", self.inst.name, self.actor_name(m.index), why)
        if m.replica is not None:
            m.replica.healthy = False
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.wrap_future(m.actor.stop.remote().future()), 15)
        await self._kill(m.actor)
        if self.members.get(m.index) is m:
            del self.members[m.index]
        self._publish()

    async def _kill(self, actor: Any) -> None:
        import ray

        with contextlib.suppress(Exception):
            await asyncio.to_thread(ray.kill, actor, no_restart=True)

    async def close(self, kill: bool) -> None:
        self.desired = 0
        if kill:
            await asyncio.gather(
                *(self._remove(m, "router exit or new options") for m in list(self.members.values()))
            )

    # -- what the router shows --------------------------------------------------------------------------------

    def status(self) -> str:
        if self.healthy():
            return "loaded"
        return "loading" if self.desired > 0 else "unloaded"

    def _publish(self) -> None:
        status = self.status()
        if status != self.inst.status:
            self.manager.set_remote_status(self.inst, status)

    def describe(self) -> dict[str, Any]:
        """`status.cluster` in `/models`: the settings and each replica with its node and state."""
        members = []
        for m in sorted(self.members.values(), key=lambda m: m.index):
            members.append(
                {
                    "name": self.actor_name(m.index),
                    "state": m.state,
                    "url": m.replica.url if m.replica else m.info.get("url", ""),
                    "node_id": m.info.get("node_id", ""),
                    "node_ip": m.info.get("node_ip", ""),
                    "pid": m.info.get("child_pid"),
                    "in_flight": m.replica.outstanding if m.replica else 0,
                    "served": m.replica.served if m.replica else 0,
                    "restarts": m.restarts,
                }
            )
        s = self.spec
        return {
            "replicas": members,
            "desired": self.desired,
            "min_replicas": s.min_replicas,
            "max_replicas": s.max_replicas,
            "target_ongoing_requests": s.target,
            "waiting": self.waiting,
        }
