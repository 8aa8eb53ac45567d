"""Slot files named by a request stay inside --slot-save-path: symbolic links are never followed (on
restore or save), only regular files are read, a FIFO never blocks a worker, and a file larger than a slot
of the model can hold is refused before it is read. Each refusal is a 400 and the server keeps serving."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Server, assert_error, start_server, stop_server

PROMPT = "A slot file stays in its own directory: the lighthouse keeper counted the ships until"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("slot-files")
    slots, outside = tmp / "slots", tmp / "outside"
    slots.mkdir()
    outside.mkdir()
    return tmp, slots, outside


@pytest.fixture(scope="module")
def server(dirs: tuple[Path, Path, Path]) -> Iterator[Server]:
    tmp, slots, _ = dirs
    s = start_server(tmp, "-c", "512", "-np", "2", "--temp", "0", "--slot-save-path", str(slots))
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def _complete(client: httpx.Client, slot: int) -> dict:
    r = client.post(
        "/completion", json={"prompt": PROMPT, "n_predict": 4, "id_slot": slot, "cache_prompt": True}
    )
    assert r.status_code == 200, r.text
    return r.json()


def _refused(client: httpx.Client, name: str, reason: str) -> None:
    t0 = time.monotonic()
    r = client.post("/slots/1?action=restore", json={"filename": name}, timeout=30)
    assert time.monotonic() - t0 < 5, f"{name}: took {time.monotonic() - t0:.1f} s"
    err = assert_error(r, 400, "invalid_request_error")
    assert err["message"] == f"Unable to restore slot: {reason}", err["message"]
    assert client.get("/health").status_code == 200


def test_save_restore_round_trip(client: httpx.Client, dirs: tuple[Path, Path, Path]) -> None:
    _, slots, _ = dirs
    first = _complete(client, 0)
    saved = client.post("/slots/0?action=save", json={"filename": "trip.bin"}).json()
    assert saved["n_written"] == (slots / "trip.bin").stat().st_size
    assert client.post("/slots/0?action=erase").json()["n_erased"] == saved["n_saved"]
    restored = client.post("/slots/0?action=restore", json={"filename": "trip.bin"})
    assert restored.status_code == 200, restored.text
    assert restored.json()["n_read"] == saved["n_written"]
    again = _complete(client, 0)
    assert again["content"] == first["content"] and again["timings"]["cache_n"] > 0


def test_link_to_a_slot_file_outside_is_refused(client: httpx.Client, dirs: tuple[Path, Path, Path]) -> None:
    _, slots, outside = dirs
    _complete(client, 1)
    assert client.post("/slots/1?action=save", json={"filename": "real.bin"}).status_code == 200
    os.replace(slots / "real.bin", outside / "real.bin")  # a valid file of this model, outside the directory
    (slots / "escape.bin").symlink_to(outside / "real.bin")
    _refused(client, "escape.bin", "the file is a symbolic link")
    assert _complete(client, 1)["timings"]["cache_n"] > 0  # the slot kept its cache


def test_link_to_a_fifo_answers_at_once(client: httpx.Client, dirs: tuple[Path, Path, Path]) -> None:
    _, slots, outside = dirs
    os.mkfifo(outside / "pipe")
    (slots / "pipe-link.bin").symlink_to(outside / "pipe")
    _refused(client, "pipe-link.bin", "the file is a symbolic link")


def test_link_to_dev_zero_is_refused(client: httpx.Client, dirs: tuple[Path, Path, Path]) -> None:
    (dirs[1] / "zero.bin").symlink_to("/dev/zero")
    _refused(client, "zero.bin", "the file is a symbolic link")


def test_fifo_in_the_directory_answers_at_once(client: httpx.Client, dirs: tuple[Path, Path, Path]) -> None:
    os.mkfifo(dirs[1] / "fifo.bin")
    for _ in range(3):  # no worker is left waiting for a writer
        _refused(client, "fifo.bin", "not a regular file")


def test_file_larger_than_a_slot_is_refused_unread(
    client: httpx.Client, dirs: tuple[Path, Path, Path]
) -> None:
    with open(dirs[1] / "huge.bin", "wb") as f:
        f.truncate(64 << 30)  # sparse: reading it would take minutes and all the memory
    r = client.post("/slots/1?action=restore", json={"filename": "huge.bin"}, timeout=30)
    err = assert_error(r, 400)
    assert err["message"].startswith("Unable to restore slot: the file (68719476736 bytes) holds more than")
    assert client.get("/health").status_code == 200


def test_save_does_not_follow_a_planted_link(client: httpx.Client, dirs: tuple[Path, Path, Path]) -> None:
    _, slots, outside = dirs
    target = outside / "precious.txt"
    target.write_text("not a slot file")
    (slots / "planted.bin").symlink_to(target)
    _complete(client, 1)
    r = client.post("/slots/1?action=save", json={"filename": "planted.bin"})
    assert r.status_code == 200, r.text
    assert target.read_text() == "not a slot file"
    assert not (slots / "planted.bin").is_symlink()
    assert (slots / "planted.bin").stat().st_size == r.json()["n_written"]
    assert client.post("/slots/1?action=restore", json={"filename": "planted.bin"}).status_code == 200
