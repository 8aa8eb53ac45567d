"""llama_tools.hub downloads against a hub stand-in on loopback: the cache layout, split models, a
connection dropped mid-file, size checks, cancel, offline, names that try to leave the cache, and the
token sent only to the hub."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hub_server import HubServer, Repo
from llama_tools.hub import Cancelled, HubError, download_model, list_cached, plan_model, remove_cached

TOKEN = "hf_" + "a" * 34
PARTS = {f"sub/m-Q4_K_M-{i:05d}-of-00003.gguf": bytes([i]) * (200_000 + i) for i in (1, 2, 3)}
FILES: dict[str, bytes | Path] = {
    **PARTS,
    "m-Q8_0.gguf": b"q8" * 1000,
    "sub/mmproj-m-f16.gguf": b"proj" * 100,
    "README.md": b"# m",
}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):
    with HubServer({"org/m-GGUF": Repo(dict(FILES))}, files={"tiny-Q4_0.gguf": b"t" * 5000}) as h:
        monkeypatch.setenv("MODEL_ENDPOINT", h.url)
        monkeypatch.delenv("HF_ENDPOINT", raising=False)
        yield h


def test_split_model_layout_and_cache(hub: HubServer, tmp_path: Path) -> None:
    seen: dict[str, tuple[int, int]] = {}
    got = download_model("org/m-GGUF", root=tmp_path, progress=lambda u, d, t: seen.__setitem__(u, (d, t)))
    assert got.name == "org/m-GGUF:Q4_K_M"
    assert (
        got.path.name == "m-Q4_K_M-00001-of-00003.gguf"
        and got.mmproj
        and got.mmproj.name.startswith("mmproj")
    )
    snap = tmp_path / "models--org--m-GGUF" / "snapshots" / Repo({}).commit
    for p, data in PARTS.items():
        f = snap / p
        assert f.is_symlink() and f.read_bytes() == data  # a link to its blob
        assert f.resolve().parent.name == "blobs"
    assert (tmp_path / "models--org--m-GGUF" / "refs" / "main").read_text() == Repo({}).commit
    assert len(seen) == 4 and all(d == t and t > 0 for d, t in seen.values())
    assert not (snap / "m-Q8_0.gguf").exists()  # only the files the tag picks
    cached = {m.name: m for m in list_cached(tmp_path)}
    assert set(cached) == {"org/m-GGUF:Q4_K_M"} and cached["org/m-GGUF:Q4_K_M"].mmproj is not None
    n = len(hub.requests("/resolve/"))
    again = download_model("org/m-GGUF:q4_k_m", root=tmp_path)
    assert again.path == got.path and len(hub.requests("/resolve/")) == n  # nothing fetched twice
    assert remove_cached("org/m-GGUF:Q4_K_M", tmp_path) and list_cached(tmp_path) == []


def test_dropped_connection_resumes(hub: HubServer, tmp_path: Path) -> None:
    hub.drops["m-Q8_0.gguf"] = 1
    got = download_model("org/m-GGUF:Q8_0", root=tmp_path, mmproj=False, retry_delay=0.01)
    assert got.path.read_bytes() == FILES["m-Q8_0.gguf"]
    gets = [r for r in hub.requests("m-Q8_0.gguf") if r[0] == "GET"]
    assert len(gets) == 2 and gets[1][2]["range"] == f"bytes={len(FILES['m-Q8_0.gguf']) // 2}-"


def test_dropped_without_ranges_restarts_then_fails_cleanly(hub: HubServer, tmp_path: Path) -> None:
    hub.no_ranges = True
    hub.drops["m-Q8_0.gguf"] = 1
    got = download_model("org/m-GGUF:Q8_0", root=tmp_path, mmproj=False, retry_delay=0.01)
    assert got.path.read_bytes() == FILES["m-Q8_0.gguf"]  # started over
    hub.drops["tiny-Q4_0.gguf"] = 5
    with pytest.raises(HubError, match="failed after 3 attempts"):
        download_model(hub.url + "files/tiny-Q4_0.gguf", root=tmp_path, retry_delay=0.01)
    assert not (tmp_path / "tiny-Q4_0.gguf").exists() and [m.name for m in list_cached(tmp_path)] == [
        "org/m-GGUF:Q8_0"
    ]


def test_size_checked(hub: HubServer, tmp_path: Path) -> None:
    hub.wrong_length.add("m-Q8_0.gguf")
    with pytest.raises(HubError, match="the hub lists"):
        download_model("org/m-GGUF:Q8_0", root=tmp_path, mmproj=False)
    assert list_cached(tmp_path) == []


def test_url_download_and_cancel(hub: HubServer, tmp_path: Path) -> None:
    got = download_model(hub.url + "files/tiny-Q4_0.gguf?download=1", root=tmp_path)
    assert got.name == "tiny-Q4_0" and got.path == tmp_path / "tiny-Q4_0.gguf"
    assert [m.name for m in list_cached(tmp_path)] == ["tiny-Q4_0"]
    assert remove_cached("tiny-Q4_0", tmp_path) and not got.path.exists()
    cancel = threading.Event()
    with pytest.raises(Cancelled):
        download_model("org/m-GGUF", root=tmp_path, cancel=cancel, progress=lambda *a: cancel.set())
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert not any(p.name.endswith(".downloadInProgress") for p in leftovers)


def test_offline_uses_the_cache_only(hub: HubServer, tmp_path: Path) -> None:
    with pytest.raises(HubError) as e:
        download_model("org/m-GGUF:Q8_0", root=tmp_path, offline=True)
    assert e.value.code == 404 and hub.log == []
    download_model("org/m-GGUF:Q8_0", root=tmp_path, mmproj=False)
    n = len(hub.log)
    got = download_model("org/m-GGUF:Q8_0", root=tmp_path, offline=True)
    assert got.path.read_bytes() == FILES["m-Q8_0.gguf"] and len(hub.log) == n


def test_names_never_leave_the_cache(hub: HubServer, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    evil = {"type": "file", "size": 3, "lfs": {"oid": "c" * 64, "size": 3}}
    bad = Repo(
        {"x-Q4_0.gguf": b"abc"},
        branches=[
            {"name": "../../escape", "targetCommit": "d" * 40},
            {"name": "main", "targetCommit": "e" * 40},
        ],
        extra_tree=[
            {**evil, "path": p} for p in ("../../evil-Q2_K.gguf", "/abs-Q2_K.gguf", "a/../../b-Q2_K.gguf")
        ]
        + [{"type": "file", "path": "y-Q3_K.gguf", "lfs": {"oid": "../../../../z", "size": 1}}],
    )
    bad.commit = "e" * 40
    hub.repos["org/bad"] = bad
    for spec in ("org/bad:Q2_K", "org/bad:Q3_K"):  # the unsafe entries are not in the plan at all
        with pytest.raises(HubError, match="no GGUF files"):
            plan_model(spec, root=root)
    got = download_model("org/bad", root=root)
    assert got.path.read_bytes() == b"abc"
    for spec in ("../x/y", "org/../x", "org/x/y", "/etc/passwd", "org/.x"):
        with pytest.raises(HubError) as e:
            plan_model(spec, root=root)
        assert e.value.code == 400
    for url in (
        hub.url + "files/..",
        hub.url + "files/..%2F..%2Fevil.gguf",
        hub.url + "files/",
        "file:///etc/x",
    ):
        with pytest.raises(HubError) as e:
            plan_model(url, root=root)
        assert e.value.code == 400
    outside = {p for p in tmp_path.rglob("*")} - {p for p in root.rglob("*")} - {root}
    assert outside == set()
    assert all(not os.path.relpath(p.resolve(), root.resolve()).startswith("..") for p in root.rglob("*"))


def test_token_only_sent_to_the_hub(hub: HubServer, tmp_path: Path) -> None:
    with HubServer(files={"m-Q8_0.gguf": FILES["m-Q8_0.gguf"], "tiny-Q4_0.gguf": b"t" * 10}) as cdn:
        hub.redirect_to = cdn.url + "files/"
        download_model("org/m-GGUF:Q8_0", root=tmp_path, token=TOKEN, mmproj=False)
        download_model(cdn.url + "files/tiny-Q4_0.gguf", root=tmp_path, token=TOKEN)
        assert hub.log and all(h.get("authorization") == f"Bearer {TOKEN}" for _, _, h in hub.log)
        assert len(cdn.log) == 2 and all("authorization" not in h for _, _, h in cdn.log)
    assert (tmp_path / "tiny-Q4_0.gguf").read_bytes() == b"t" * 10
