"""The router serves the web UI at `/` itself, as llama-server does: the built files of `llama_webui`
(public even with an API key, every asset the page links loads), `--path DIR`, and `--no-webui`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Router, start_router
from litestar.testing import TestClient

import llama_webui
from llama_router.app import create_app
from llama_router.config import RouterConfig


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    models = tmp_path_factory.mktemp("no-models")
    yield from start_router(["--models-dir", str(models), "--api-key", "k-ui"], {})


def test_the_page_and_its_assets_load_without_the_key(router: Router) -> None:
    page = router.http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == (llama_webui.static_dir() / "index.html").read_text()
    links = sorted(set(re.findall(r'(?:href|src)="(/[^"]+)"', page.text)))
    assert any(link.endswith(".js") for link in links) and any(link.endswith(".css") for link in links)
    for link in links:
        r = router.http.get(link)
        assert r.status_code == 200, link
        assert r.content == (llama_webui.static_dir() / link[1:]).read_bytes()
        kind = r.headers["content-type"]
        assert kind.startswith({".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}.get(
            Path(link).suffix, "")), (link, kind)  # fmt: skip
    assert router.http.get("/index.html").status_code == 200
    # only the UI's files are public: the API still needs the key, an unknown path is a 404
    assert router.http.get("/models").status_code == 401
    assert router.http.get("/models", headers={"Authorization": "Bearer k-ui"}).status_code == 200
    r = router.http.get("/nope", headers={"Authorization": "Bearer k-ui"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert router.http.get("/_app/nope.js").status_code == 401  # not a file of the UI: not public


def test_path_and_no_webui(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<html>mine</html>")
    (tmp_path / "app.js").write_text("1")
    with TestClient(create_app(RouterConfig(static_path=str(tmp_path)))) as c:
        assert c.get("/").text == "<html>mine</html>" and c.get("/app.js").text == "1"
    with TestClient(create_app(RouterConfig(webui=False))) as c:
        assert c.get("/").status_code == 404
        sw = c.get("/sw.js")  # a service worker that unregisters itself, as llama-server without its UI
        assert sw.status_code == 200 and "unregister" in sw.text
