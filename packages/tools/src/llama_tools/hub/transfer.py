"""One file over HTTP into the cache: streamed into `<dest>.downloadInProgress`, its size checked against
the advertised length, renamed into place atomically. A dropped connection resumes with a byte range when
the server allows it (else starts over), up to `attempts` times; a cancel removes the partial file."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from .http import HubError

__all__ = ["TEMP_SUFFIX", "Cancelled", "Progress", "fetch_file"]

TEMP_SUFFIX = ".downloadInProgress"
Progress = Callable[[str, int, int], None]  # (url, bytes done, total bytes or 0)


class Cancelled(HubError):
    """The download was cancelled."""

    def __init__(self) -> None:
        super().__init__("download cancelled", 400)


class _Broken(Exception):
    """The body ended early or the connection broke: worth another attempt."""


def fetch_file(
    client: httpx.Client,
    url: str,
    dest: Path,
    *,
    size: int | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    attempts: int = 3,
    retry_delay: float = 1.0,
) -> None:
    """Download `url` to `dest` (its folder is created). Raises HubError (Cancelled when cancelled)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + TEMP_SUFFIX)
    cancel = cancel or threading.Event()
    last: Exception | None = None
    try:
        for attempt in range(attempts):
            if attempt and cancel.wait(retry_delay * 2 ** (attempt - 1)):
                break
            if cancel.is_set():
                break
            try:
                _pull(client, url, tmp, size, progress, cancel)
            except (_Broken, httpx.TransportError) as e:
                last = e
                continue
            os.replace(tmp, dest)
            return
        if cancel.is_set():
            raise Cancelled()
        raise HubError(f"download of {url} failed after {attempts} attempts: {last}")
    except Cancelled:
        tmp.unlink(missing_ok=True)
        raise


def _pull(
    client: httpx.Client,
    url: str,
    tmp: Path,
    size: int | None,
    progress: Progress | None,
    cancel: threading.Event,
) -> None:
    have = tmp.stat().st_size if tmp.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    with client.stream("GET", url, headers=headers) as r:
        if have and r.status_code == 206:
            mode = "ab"
        elif r.status_code == 200:
            have, mode = 0, "wb"  # no range support: start over
        elif have and r.status_code == 416:
            tmp.unlink(missing_ok=True)
            raise _Broken("the partial file does not match the server's: starting over")
        else:
            raise HubError(
                f"download of {url} failed with status {r.status_code}", 404 if r.status_code == 404 else 500
            )
        length = r.headers.get("content-length")
        total = have + int(length) if length and length.isdigit() else (size or 0)
        if size is not None and total and total != size:
            raise HubError(f"{url}: the server sends {total} bytes, the hub lists {size}")
        done, last_report = have, 0.0
        if progress:
            progress(url, done, total)
        with open(tmp, mode) as f:
            for chunk in r.iter_raw():  # as received: a break keeps what arrived
                if cancel.is_set():
                    raise Cancelled()
                f.write(chunk)
                done += len(chunk)
                if total and done > total:
                    f.close()
                    tmp.unlink(missing_ok=True)
                    raise HubError(f"{url}: more bytes than the advertised {total}")
                now = time.monotonic()
                if progress and now - last_report >= 0.1:
                    progress(url, done, total)
                    last_report = now
    if total and done != total:
        raise _Broken(f"got {done} of {total} bytes")
    if progress:
        progress(url, done, total or done)
