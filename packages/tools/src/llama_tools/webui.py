"""The web UI's route handlers, shared by `llama-server` and `llama-router` (both serve it at `/`).

`webui_routes(root)` serves the built files of a directory (`llama_webui.static_dir()` or `--path DIR`),
or, with `root=None` (`--no-webui`), only a `/sw.js` that unregisters itself (also served next to a
directory that has no `sw.js`: a browser may hold a worker of another UI that was served at this address). It also returns the URL
paths of those files: the callers keep them public when an API key is set (the page must load before the
user can enter the key) and serve them while a model loads.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from typing import Any

from litestar import Response, get
from litestar.response import File
from litestar.static_files import create_static_files_router

__all__ = ["webui_routes"]

# A service worker that removes itself: a browser that once registered one for this address drops it and
# reloads its pages from the network (llama.cpp answers `/sw.js` with one when the web UI is off).
_UNREGISTER_SW = """self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => {
  event.waitUntil(
    self.registration
      .unregister()
      .then(() => self.clients.matchAll())
      .then((clients) => clients.forEach((client) => client.navigate(client.url))),
  );
});
"""


@get("/sw.js", include_in_schema=False, sync_to_thread=False)
def _unregister_service_worker() -> Response[str]:
    return Response(_UNREGISTER_SW, media_type="application/javascript; charset=utf-8")


def _file_route(path: str, file: Path) -> Any:
    media_type = mimetypes.guess_type(file.name)[0] or "application/octet-stream"

    @get(path, name=f"webui:{path}", include_in_schema=False, sync_to_thread=False)
    def serve() -> File:
        return File(file, filename=file.name, media_type=media_type, content_disposition_type="inline")

    return serve


def webui_routes(root: Path | None) -> tuple[list[Any], frozenset[str]]:
    """The route handlers of the web UI in `root` (None: the UI is off) and the URL paths of its files.

    One route per top-level file and one static-files router per top-level folder (`/_app`), not a
    catch-all at `/`: an unknown path keeps answering 404 for every method."""
    if root is None:
        return [_unregister_service_worker], frozenset({"/sw.js"})
    files = frozenset("/" + p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    routes: list[Any] = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir():
            routes.append(create_static_files_router(f"/{entry.name}", [entry], name=f"webui:{entry.name}"))
        elif entry.is_file():
            routes.append(_file_route(f"/{entry.name}", entry))
    if (root / "index.html").is_file():
        routes.append(_file_route("/", root / "index.html"))
    if "/sw.js" not in files:  # a UI without a service worker still retires one an earlier UI registered here
        routes.append(_unregister_service_worker)
        files |= {"/sw.js"}
    return routes, files
