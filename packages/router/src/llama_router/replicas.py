"""Remote replicas: a preset entry whose `remote = URL[, URL...]` names llama-servers on other hosts.
Requests are balanced by least outstanding requests over the healthy ones; a background check takes a
replica out when `/health` fails or it refuses the replica's API key, and puts it back when it answers
again. A replica gets only its own configured key (`Authorization: Bearer`), never a client's."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from .models import Instance, ModelManager

__all__ = ["Replica", "check_replicas", "pick_replica", "replicas_of"]

log = logging.getLogger("llama_router")


@dataclass(slots=True)
class Replica:
    url: str
    key: str = field(default="", repr=False)  # the replica's own API key, sent as a bearer token
    outstanding: int = 0
    healthy: bool = True
    served: int = 0
    lost: asyncio.Event = field(default_factory=asyncio.Event)  # set when its process is known gone


def replicas_of(remote: tuple[str, ...], keys: tuple[str, ...]) -> list[Replica]:
    """The replicas of an entry: `keys` is empty (no key) or aligned with the URLs."""
    return [Replica(u.rstrip("/"), k) for u, k in zip(remote, keys or ("",) * len(remote), strict=True)]


def pick_replica(inst: Instance) -> Replica | None:
    """The healthy replica with the fewest requests in flight (ties: the one that served fewer)."""
    healthy = [r for r in inst.replicas if r.healthy]
    if not healthy:
        return None
    best = min(healthy, key=lambda r: (r.outstanding, r.served))
    best.served += 1
    return best


async def _check(client: httpx.AsyncClient, r: Replica) -> str:
    """Why the replica cannot serve ("" when it can): `/health` must answer 200, and an authenticated
    route must take the replica's key (`/health` is public on a server with `--api-key`)."""
    headers = {"Authorization": f"Bearer {r.key}"} if r.key else {}
    try:
        resp = await client.get(r.url + "/health", headers=headers, timeout=2.0)
        if resp.status_code != 200:
            return f"/health answered {resp.status_code}"
        resp = await client.get(r.url + "/v1/models", headers=headers, timeout=2.0)
    except httpx.HTTPError as e:
        return type(e).__name__
    if resp.status_code in (401, 403):
        return "it refused the API key given for it" if r.key else "it requires an API key"
    return ""


async def check_replicas(manager: ModelManager, client: httpx.AsyncClient) -> None:
    """Forever: every `health_interval` seconds, probe each replica and update the model's status."""
    while True:
        for inst in [i for i in manager.instances.values() if i.entry.remote]:
            replicas = list(inst.replicas)  # a reload may replace them meanwhile
            reasons = await asyncio.gather(*(_check(client, r) for r in replicas))
            for r, why in zip(replicas, reasons, strict=True):
                if not why and not r.healthy:
                    log.warning("replica %s of %s is back", r.url, inst.name)
                elif why and r.healthy:
                    log.warning("replica %s of %s is out: %s", r.url, inst.name, why)
                r.healthy = not why
            status = "loaded" if any(r.healthy for r in inst.replicas) else "unloaded"
            if status != inst.status:
                manager.set_remote_status(inst, status)
        await asyncio.sleep(manager.config.health_interval)
