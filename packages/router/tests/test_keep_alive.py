"""Keep-alive and pinned models: a request's `keep_alive` (Ollama's) unloads its model once idle that long,
bounded by `--keep-alive-max`; `/models` says when; a preset's `pin = true` model is never unloaded by
keep-alive nor evicted by the LRU queue."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SMOL, Router, start_router

from llama_router.keep_alive import KeepAliveError, effective_keep_alive, parse_keep_alive


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(5, 5.0), (0, 0.0), (-1, -1.0), ("30", 30.0), ("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0),
     ("250ms", 0.25), ("-1m", -60.0), ("1.5s", 1.5)],
)  # fmt: skip
def test_durations(value: object, seconds: float) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["", "5x", "m5", "5m junk", True, None, [], float("nan"), "1h-2m"])
def test_bad_durations(value: object) -> None:
    with pytest.raises(KeepAliveError):
        parse_keep_alive(value)


def test_the_maximum_bounds_every_value() -> None:
    assert effective_keep_alive(None, -1, -1) == -1  # no keep-alive anywhere: until evicted
    assert effective_keep_alive(10, -1, -1) == 10
    assert effective_keep_alive(None, 300, 60) == 60
    assert effective_keep_alive(-1, 300, 60) == 60  # "forever" is bounded too
    assert effective_keep_alive(0, 300, 60) == 0


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    d = tmp_path_factory.mktemp("keep")
    preset = d / "preset.ini"
    preset.write_text(
        "".join(f"[{n}]\nmodel = {SMOL}\n" for n in ("free-a", "free-b"))
        + f"[pinned]\nmodel = {SMOL}\npin = true\n"
    )
    env = {"LLAMA_CACHE": str(d / "cache")}
    yield from start_router(
        ["--models-preset", str(preset), "--models-max", "2", "--keep-alive-max", "3"], env
    )


def _ask(router: Router, model: str, **extra: object) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **extra}
    r = router.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


def _item(router: Router, model: str) -> dict:
    return next(i for i in router.http.get("/models").json()["data"] if i["id"] == model)


def test_keep_alive_unloads_an_idle_model(router: Router) -> None:
    _ask(router, "free-a", keep_alive="1s")
    status = _item(router, "free-a")["status"]
    assert status["value"] == "loaded" and 0 < status["unload_at"] - time.time() <= 1.5
    router.wait_status("free-a", {"unloaded"}, timeout=10)
    assert any("free-a: unloading, idle past its keep-alive" in ln for ln in router.log)


def test_the_maximum_applies_to_forever(router: Router) -> None:
    t0 = time.time()
    _ask(router, "free-b", keep_alive=-1)
    assert _item(router, "free-b")["status"]["unload_at"] <= t0 + 3 + 60  # bounded by --keep-alive-max 3
    router.wait_status("free-b", {"unloaded"}, timeout=15)
    assert time.time() - t0 >= 3 - 0.5


def test_bad_keep_alive_is_a_400(router: Router) -> None:
    body = {"model": "free-a", "messages": [{"role": "user", "content": "hi"}], "keep_alive": "soon"}
    r = router.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]["message"]


def test_a_pinned_model_stays(router: Router) -> None:
    _ask(router, "pinned", keep_alive=0)
    item = _item(router, "pinned")
    assert item["status"]["pinned"] is True and "unload_at" not in item["status"]
    # LRU: the pinned model is the least recently used, yet loading two others evicts the other one
    _ask(router, "free-a", keep_alive=-1)
    _ask(router, "free-b", keep_alive=-1)
    assert router.status("pinned") == "loaded"
    assert router.status("free-a") in ("unloaded", "stopping")
    time.sleep(1.0)
    assert router.status("pinned") == "loaded"  # keep_alive 0 does not unload it either


def test_bad_preset_value(tmp_path: Path) -> None:
    preset = tmp_path / "p.ini"
    preset.write_text(f"[m]\nmodel = {SMOL}\nkeep-alive = later\n")
    with pytest.raises(RuntimeError, match="keep-alive"):
        Router(["--models-preset", str(preset)], {"LLAMA_CACHE": str(tmp_path)})
