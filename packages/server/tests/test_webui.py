"""The web UI's static files at `/` (the `llama-webui` package's build), `--no-webui` and `--path DIR`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Server, assert_error, start_server, stop_server

import llama_webui

KEY = "webui-test-key"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with an API key: the UI's files stay public, the API does not."""
    s = start_server(tmp_path_factory.mktemp("webui"), "-c", "512", "-np", "1", "--api-key", KEY)
    yield s
    stop_server(s)


def _asset_paths(html: str) -> list[str]:
    return re.findall(r'"(/_app/immutable/[^"]+\.(?:js|css))"', html)


def test_the_ui_is_served_at_root(keyed: Server) -> None:
    r = httpx.get(keyed.base_url + "/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert r.text == (llama_webui.static_dir() / "index.html").read_text()
    assert httpx.get(keyed.base_url + "/index.html").text == r.text


def test_assets_load_without_the_key(keyed: Server) -> None:
    html = httpx.get(keyed.base_url + "/").text
    paths = _asset_paths(html)
    assert any(p.endswith(".js") for p in paths) and any(p.endswith(".css") for p in paths)
    for path in paths:
        r = httpx.get(keyed.base_url + path)
        assert r.status_code == 200, path
        assert r.content == (llama_webui.static_dir() / path.lstrip("/")).read_bytes()
    assert (
        "javascript"
        in httpx.get(keyed.base_url + next(p for p in paths if p.endswith(".js"))).headers["content-type"]
    )


def test_pwa_files_and_the_service_worker_are_public(keyed: Server) -> None:
    """As llama-server's UI files (llama.cpp's test_access_static_assets_without_api_key): the manifest,
    the version file and `/sw.js` load without the key. Our UI registers no service worker, so `/sw.js`
    retires one another UI registered at this address."""
    html = httpx.get(keyed.base_url + "/").text
    assert '<link rel="manifest" href="/manifest.webmanifest" />' in html
    manifest = httpx.get(keyed.base_url + "/manifest.webmanifest")
    assert manifest.status_code == 200 and manifest.headers["content-type"].startswith(
        "application/manifest+json"
    )
    assert manifest.json()["icons"][0]["src"] == "favicon.svg"
    assert httpx.get(keyed.base_url + "/favicon.svg").status_code == 200
    assert httpx.get(keyed.base_url + "/_app/version.json").json() == {"version": "0.1.0"}
    sw = httpx.get(keyed.base_url + "/sw.js")
    assert sw.status_code == 200 and "javascript" in sw.headers["content-type"] and "unregister()" in sw.text


def test_the_api_still_needs_the_key(keyed: Server) -> None:
    assert_error(httpx.get(keyed.base_url + "/v1/models"), 401, "authentication_error")
    assert_error(httpx.get(keyed.base_url + "/props"), 401, "authentication_error")
    r = httpx.get(keyed.base_url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    # an unknown path is not a UI file: it needs the key like any API route
    assert_error(httpx.get(keyed.base_url + "/_app/nope.js"), 401, "authentication_error")


def test_no_webui(tmp_path: Path) -> None:
    s = start_server(tmp_path, "-c", "256", "-np", "1", "--no-webui")
    try:
        r = httpx.get(s.base_url + "/")
        assert r.status_code == 404
        assert r.json() == {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}
        sw = httpx.get(s.base_url + "/sw.js")
        assert sw.status_code == 200
        assert "javascript" in sw.headers["content-type"]
        assert "unregister()" in sw.text
    finally:
        stop_server(s)


def test_path_serves_another_folder(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "css").mkdir(parents=True)
    (site / "index.html").write_text("<h1>custom</h1>")
    (site / "css" / "a.css").write_text("h1{}")
    s = start_server(tmp_path, "-c", "256", "-np", "1", "--path", str(site), "--api-key", KEY)
    try:
        assert httpx.get(s.base_url + "/").text == "<h1>custom</h1>"
        assert httpx.get(s.base_url + "/css/a.css").text == "h1{}"
        assert_error(httpx.get(s.base_url + "/v1/models"), 401, "authentication_error")
    finally:
        stop_server(s)


def test_unknown_paths_stay_404_for_every_method(keyed: Server) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    for method in ("GET", "POST", "DELETE"):
        assert_error(httpx.request(method, keyed.base_url + "/nope", headers=auth), 404, "not_found_error")
    assert_error(httpx.get(keyed.base_url + "/_app/nope.js", headers=auth), 404, "not_found_error")
