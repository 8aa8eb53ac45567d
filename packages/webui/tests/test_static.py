"""The Python package ships a complete build of the app (the browser tests live beside: *.test.ts, e2e/)."""

from __future__ import annotations

import re

import llama_webui


def test_static_dir_has_the_app() -> None:
    root = llama_webui.static_dir()
    html = (root / "index.html").read_text()
    assets = re.findall(r'"/(_app/immutable/[^"]+)"', html)
    assert any(a.endswith(".js") for a in assets) and any(a.endswith(".css") for a in assets)
    for asset in assets:
        assert (root / asset).is_file(), asset


def test_the_build_names_no_local_paths() -> None:
    for path in llama_webui.static_dir().rglob("*"):
        if path.suffix in {".html", ".js", ".css", ".json"}:
            assert "/work/" not in path.read_text(errors="replace"), path
