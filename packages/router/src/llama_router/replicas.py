"""Remote replicas: a preset entry whose `remote = URL[, URL...]` names llama-servers on other hosts.
Requests are balanced by least outstanding requests over the healthy ones; a background check takes a
replica out when `/health` fails and puts it back when it answers again."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from .models import Instance, ModelManager

__all__ = ["Replica", "check_replicas", "pick_replica"]

log = logging.getLogger("llama_router")


@dataclass(slots=True)
class Replica:
    url: str
    key: str = ""
    outstanding: int = 0
    healthy: bool = True
    served: int = 0


def pick_replica(inst: Instance) -> Replica | None:
    """The healthy replica with the fewest requests in flight (ties: the one that served fewer)."""
    healthy = [r for r in inst.replicas if r.healthy]
    if not healthy:
        return None
    best = min(healthy, key=lambda r: (r.outstanding, r.served))
    best.served += 1
    return best


async def _check(client: httpx.AsyncClient, r: Replica) -> bool:
    try:
        resp = await client.get(r.url + "/health", timeout=2.0)
        return resp.status_code == 200
    except httpx.HTTPError:
        return False


async def check_replicas(manager: ModelManager, client: httpx.AsyncClient) -> None:
    """Forever: every `health_interval` seconds, probe each replica and update the model's status."""
    while True:
        for inst in [i for i in manager.instances.values() if i.entry.remote]:
            results = await asyncio.gather(*(_check(client, r) for r in inst.replicas))
            for r, ok in zip(inst.replicas, results, strict=True):
                if ok != r.healthy:
                    log.warning("replica %s of %s is %s", r.url, inst.name, "back" if ok else "out")
                r.healthy = ok
            status = "loaded" if any(results) else "unloaded"
            if status != inst.status:
                manager.set_remote_status(inst, status)
        await asyncio.sleep(manager.config.health_interval)
