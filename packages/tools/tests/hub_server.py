"""A small Hugging Face hub stand-in on loopback: `api/models/<repo>/refs`, `.../tree/<commit>`,
`<repo>/resolve/<commit>/<path>` (HEAD, byte ranges), plain files under `/files/`, and faults on demand
(a connection dropped mid-file, no range support, a redirect to another server, a wrong length)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

CHUNK = 1 << 16


@dataclass
class Repo:
    files: dict[str, bytes | Path]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    branches: list[dict[str, str]] | None = None
    extra_tree: list[dict[str, Any]] = field(default_factory=list)  # raw items appended to the tree


def _size(data: bytes | Path) -> int:
    return len(data) if isinstance(data, bytes) else data.stat().st_size


def _oid(path: str, data: bytes | Path) -> str:
    return hashlib.sha256(path.encode() + str(_size(data)).encode()).hexdigest()


class HubServer:
    """Start with `with HubServer(repos) as hub:`; `hub.url` ends in `/`. Fault knobs are attributes."""

    def __init__(self, repos: dict[str, Repo] | None = None, files: dict[str, bytes | Path] | None = None):
        self.repos = repos or {}
        self.files = files or {}
        self.drops: dict[str, int] = {}  # file name -> connections still to drop midway
        self.no_ranges = False
        self.wrong_length: set[str] = set()  # file names served with a Content-Length one byte short
        self.slow: set[str] = set()  # file names sent at about 10 MB/s
        self.redirect_to: str | None = None  # resolve URLs redirect here (another server's /files/)
        self.log: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers)
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_HEAD(self) -> None:
                hub._handle(self, body=False)

            def do_GET(self) -> None:
                hub._handle(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def __enter__(self) -> HubServer:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def requests(self, needle: str) -> list[tuple[str, str, dict[str, str]]]:
        return [r for r in self.log if needle in r[1]]

    # -- handling --------------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        with self.lock:
            self.log.append((h.command, path, {k.lower(): v for k, v in h.headers.items()}))
        if path.startswith("/api/models/"):
            return self._api(h, path[len("/api/models/") :])
        if path.startswith("/files/"):
            data = self.files.get(path[len("/files/") :])
            return self._file(h, path[len("/files/") :], data, body)
        parts = path.lstrip("/").split("/", 4)
        if len(parts) == 5 and parts[2] == "resolve":
            repo = self.repos.get(f"{parts[0]}/{parts[1]}")
            if repo and parts[3] == repo.commit:
                if self.redirect_to:
                    h.send_response(302)
                    h.send_header("Location", self.redirect_to + parts[4].rsplit("/", 1)[-1])
                    h.send_header("Content-Length", "0")
                    h.end_headers()
                    return
                return self._file(h, parts[4], repo.files.get(parts[4]), body)
        self._json(h, {"error": "Repository not found"}, 404)

    def _api(self, h: BaseHTTPRequestHandler, rest: str) -> None:
        if rest.endswith("/refs"):
            repo = self.repos.get(rest[: -len("/refs")])
            if repo is None:
                return self._json(h, {"error": "Repository not found"}, 404)
            branches = repo.branches or [{"name": "main", "targetCommit": repo.commit}]
            return self._json(h, {"branches": branches, "tags": []})
        name, _, commit = rest.partition("/tree/")
        repo = self.repos.get(name)
        if repo is None or commit != repo.commit:
            return self._json(h, {"error": "Repository not found"}, 404)
        tree: list[dict[str, Any]] = []
        for p, data in repo.files.items():
            item: dict[str, Any] = {"type": "file", "path": p, "size": _size(data), "oid": "ab" * 20}
            if p.endswith(".gguf"):
                item["lfs"] = {"oid": _oid(p, data), "size": _size(data)}
            tree.append(item)
        self._json(h, tree + repo.extra_tree)

    def _json(self, h: BaseHTTPRequestHandler, data: Any, code: int = 200) -> None:
        raw = json.dumps(data).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        h.wfile.write(raw)

    def _file(self, h: BaseHTTPRequestHandler, name: str, data: bytes | Path | None, body: bool) -> None:
        if data is None:
            return self._json(h, {"error": "Entry not found"}, 404)
        size = _size(data)
        start = 0
        rng = h.headers.get("Range", "")
        if rng.startswith("bytes=") and not self.no_ranges:
            start = int(rng[6:].split("-")[0])
            if start >= size:
                h.send_response(416)
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        else:
            h.send_response(200)
        length = size - start - (1 if name in self.wrong_length else 0)
        h.send_header("Content-Length", str(length))
        h.send_header("Accept-Ranges", "none" if self.no_ranges else "bytes")
        h.end_headers()
        if not body:
            return
        with self.lock:
            drop = self.drops.get(name, 0) > 0
            if drop:
                self.drops[name] -= 1
        cut = start + (size - start) // 2 if drop else start + length
        self._send_bytes(h, data, start, cut, name in self.slow)
        if drop:
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)  # the connection breaks off midway

    def _send_bytes(
        self, h: BaseHTTPRequestHandler, data: bytes | Path, start: int, end: int, slow: bool = False
    ) -> None:
        if isinstance(data, bytes):
            h.wfile.write(data[start:end])
            return
        with open(data, "rb") as f:
            f.seek(start)
            left = end - start
            while left > 0:
                chunk = f.read(min(CHUNK * 16, left))
                if not chunk:
                    return
                h.wfile.write(chunk)
                left -= len(chunk)
                if slow:
                    time.sleep(0.1)
