"""Model downloads into the cache (router.md §5.5, §5.6): `POST /models` checks the spec with the hub,
then runs the download in a `llama-server` child in download mode (its progress lines become
`download_progress` events), cancelled by `POST /models/unload`; the catalogue is reloaded when the
child is gone. `DELETE /models?model=NAME` removes a cache entry and its files."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from llama_tools.hub import HubError, is_url, plan_model, remove_cached, split_spec, valid_repo_id

from .catalogue import Entry
from .child import ChildProcess
from .models import Instance, LoadError
from .preset import canonical_name

if TYPE_CHECKING:
    from .models import ModelManager

__all__ = ["Downloads"]

log = logging.getLogger("llama_router")
CANCEL_TIMEOUT = 10.0


def download_name(spec: str) -> str:
    """The catalogue name a spec will have: `user/repo:TAG` (tag upper-cased) or a URL's file stem."""
    if is_url(spec):
        return plan_model(spec).name  # no network: names only
    repo, _ = split_spec(spec)
    if not valid_repo_id(repo):
        raise LoadError(400, "invalid HF repo format, expected <user>/<model>[:quant]")
    return canonical_name(spec)


class Downloads:
    """The download children of one router."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    async def start(self, spec: str) -> None:
        m = self.manager
        if m.config.offline:
            raise LoadError(400, "downloads are disabled in offline mode")
        try:
            name = download_name(spec)
        except HubError as e:
            raise LoadError(400, str(e)) from None
        known = m.resolve(name)
        if known is not None and known.status != "downloaded":
            raise LoadError(400, f"model '{name}' already exists")
        try:  # the metadata lookup: a repository with nothing to download fails here, not in the child
            await asyncio.to_thread(plan_model, spec, token=m.config.hf_token)
        except HubError as e:
            raise LoadError(400 if e.code < 500 else 500, str(e)) from None
        source = {"model-url": spec} if is_url(spec) else {"hf-repo": name}
        inst = Instance(Entry(name, "cache", source), status="downloading")
        m.instances[name] = inst
        self._spawn(inst, spec)

    def _spawn(self, inst: Instance, spec: str) -> None:
        m = self.manager
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "HF_TOKEN"))}
        env |= {"LLAMA_SERVER_ROUTER_PORT": str(m.config.port), "LLAMA_SERVER_CHILD_MODE": "download"}
        env["LLAMA_ARG_MODEL_URL" if is_url(spec) else "LLAMA_ARG_HF_REPO"] = (
            spec if is_url(spec) else inst.name
        )
        if m.config.hf_token:
            env["HF_TOKEN"] = m.config.hf_token  # in the environment: never in status.args or logs
        inst.args = list(m.config.server_command)
        inst.progress = {}
        child = ChildProcess(
            inst.args,
            env,
            f"download {inst.name}",
            lambda s, p: self._on_state(inst, child, s, p),
            lambda c: None,
        )
        inst.child = child
        m.broadcast(inst.name, "model_status", {"status": "downloading"})
        m._spawn(self._run(inst, child))

    async def _run(self, inst: Instance, child: ChildProcess) -> None:
        try:
            await child.start()
        except OSError as e:
            log.error("cannot start the download child of %s: %s", inst.name, e)
            self._finish(inst, False)
            return
        await child.exited.wait()
        if inst.status == "downloading":  # ended without a result: crashed or killed
            self._finish(inst, False)
        if inst.child is child:
            inst.child = None
        await self.manager.reload()

    def _on_state(self, inst: Instance, child: ChildProcess, state: str, payload: dict[str, Any]) -> None:
        if state != "downloading" or inst.child is not child:
            return
        result = payload.get("result")
        if result in ("download_finished", "download_failed"):
            self._finish(inst, result == "download_finished")
            child.send_exit()
        elif isinstance(payload.get("url"), str):
            assert inst.progress is not None
            inst.progress[payload["url"]] = {
                "done": payload.get("downloaded", 0),
                "total": payload.get("total", 0),
            }
            self.manager.broadcast(inst.name, "download_progress", {"progress": dict(inst.progress)})

    def _finish(self, inst: Instance, ok: bool) -> None:
        if inst.status != "downloading":
            return
        inst.status = "downloaded"  # dropped (or replaced by the cache entry) at the next reload
        self.manager.broadcast(inst.name, "download_finished" if ok else "download_failed")
        self.manager._spawn(self.manager.notify())

    async def cancel(self, inst: Instance) -> None:
        """Ask the child to stop; returns once the status has left `downloading`."""
        child = inst.child
        if child is None:
            return
        child.send_exit()
        m = self.manager
        try:
            async with m.changed:
                await asyncio.wait_for(
                    m.changed.wait_for(lambda: inst.status != "downloading"), CANCEL_TIMEOUT
                )
        except TimeoutError:
            child.kill()

    async def remove(self, name: str) -> None:
        m = self.manager
        inst = m.resolve(name)
        if inst is None:
            raise LoadError(500, f"model name={name} is not found")
        if inst.entry.source != "cache":
            raise LoadError(500, f"model name={name} is not removable (not from cache)")
        if inst.status == "downloading":
            await self.cancel(inst)
        elif inst.running:
            await m.stop(inst)
        try:
            ok = await asyncio.to_thread(remove_cached, inst.name)
        except (OSError, ValueError) as e:
            log.warning("removing %s from the cache: %s", inst.name, e)
            ok = False
        if not ok:
            log.warning("removing model name=%s found no cached files", inst.name)
        if m.instances.get(inst.name) is inst:
            del m.instances[inst.name]
        m.broadcast(inst.name, "model_remove")
        await m.notify()

    async def shutdown(self) -> None:
        return None
