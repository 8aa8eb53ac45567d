"""`--tools-runtime`: the isolate every tool call runs in unless `x-tool-runtime` names another.

`docker:<image>` / `podman:<image>` start `<engine> run --rm -i --cidfile <tmp> <image> sh` at start-up,
keep its stdin open (closing it ends the container, and `--rm` removes it), reuse the container for every
call and start a new one when it died. The attach forms and `ssh:` only name an isolate that exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile

from .builtin.io import RuntimeSpecError, container_spec, make_io
from .builtin.process import kill_group, wait_exit

__all__ = ["ToolsRuntime", "check_runtime_spec"]

log = logging.getLogger("llama_tools")

_CID_WAIT = 10.0


def check_runtime_spec(spec: str) -> None:
    """Start-up validation of `--tools-runtime`: the scheme, the id or target, and the engine binary.
    Raises RuntimeSpecError (never a silent host fallback)."""
    if not spec:
        return
    container = container_spec(spec)
    if container is not None and not container[2]:
        if not container[1] or container[1].startswith("-"):
            raise RuntimeSpecError(f"invalid container image: {container[1]}")
    else:
        make_io(spec, "")  # validates the attach and ssh forms
    binary = container[0] if container is not None else "ssh"
    if shutil.which(binary) is None:
        raise RuntimeSpecError(f"tool runtime unavailable: {binary} is not installed ({spec})")


def spawn_argv(engine: str, image: str, cidfile: str) -> list[str]:
    """The command line that starts the owned container."""
    return [engine, "run", "--rm", "-i", "--cidfile", cidfile, image, "sh"]


class ToolsRuntime:
    """The `--tools-runtime` isolate as the `x-tool-runtime` spec each call uses ("" = the host)."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        container = container_spec(spec)
        self.owned = container is not None and not container[2]
        self.engine, self.image = (container[0], container[1]) if container else ("", "")
        self.proc: asyncio.subprocess.Process | None = None
        self.container_id = ""
        self.lock = asyncio.Lock()

    async def call_spec(self) -> str:
        """The attach spec for one call, (re)starting the owned container first when needed."""
        if not self.owned:
            return self.spec
        async with self.lock:
            if self.proc is None or self.proc.returncode is not None:
                await self._spawn()
        return f"{self.engine}-container:{self.container_id}"

    async def _spawn(self) -> None:
        fd, cidfile = tempfile.mkstemp(prefix="llama-tools-", suffix=".cid")
        os.close(fd)
        os.unlink(cidfile)  # the engine refuses a cidfile that exists
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *spawn_argv(self.engine, self.image, cidfile),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            raise RuntimeSpecError(f"tool runtime unavailable: {self.engine}: {e}") from None
        cid = ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CID_WAIT
        while not cid and loop.time() < deadline and self.proc.returncode is None:
            with contextlib.suppress(OSError), open(cidfile) as f:
                cid = f.read().strip()
            if not cid:
                await asyncio.sleep(0.1)
        with contextlib.suppress(OSError):
            os.unlink(cidfile)
        if not cid:
            await self.stop()
            raise RuntimeSpecError(
                f"timed out waiting for {self.engine} container to start (image: {self.image})"
            )
        self.container_id = cid
        log.info("tools run in %s container %s (image %s)", self.engine, cid[:12], self.image)

    async def stop(self) -> None:
        """Close the owned container's stdin (`--rm` removes it); kill the client if it lingers."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                proc.stdin.close()
        if not await wait_exit(proc, 5):
            kill_group(proc)
