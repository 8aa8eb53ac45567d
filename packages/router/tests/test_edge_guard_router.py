"""The edge guard (llama_tools' guard.py) on a real router (`llama-server --models-dir`, router mode): its
own routes that act on the machine (model loads, unloads, downloads and removals, `/tools`, `/cors-proxy`)
and the slot files it forwards to a child refuse what a page of another site can send without a preflight,
foreign origins and DNS-rebound Host names; the web UI's same-origin requests, clients without an Origin
and API keys still work. And the router's CORS headers: llama.cpp's test_security.py cases
(test_cors_origins_localhost_reflects, _rejects, test_cors_origins_defaults_to_localhost_with_tools_enabled)
against ServerPreset.router()-like routers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Router, start_router

KEY = "guard-router-key"
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}
EVIL = "https://evil.example"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("work")
    (d / "slots").mkdir()
    return d


@pytest.fixture(scope="module")
def router(models_dir: Path, cache_env: dict[str, str], work: Path) -> Iterator[Router]:
    """`--tools all` without --cors-origins (so `localhost`), /cors-proxy, slot files in the children."""
    args = ["--models-dir", str(models_dir), "--models-max", "1", "--tools", "all", "--tools-dir", str(work),
            "--ui-mcp-proxy", "--slot-save-path", str(work / "slots")]  # fmt: skip
    yield from start_router(args, cache_env)


def _plain(resp: httpx.Response) -> dict[str, str]:
    """The response headers in a plain dict, names as sent: llama.cpp's tests look them up this way
    (`dict(response.headers)`), so `Access-Control-Allow-Origin` must be spelled as llama-server does."""
    return {k.decode(): v.decode() for k, v in resp.headers.raw}


def _port(r: Router) -> int:
    return int(r.url.rsplit(":", 1)[1])


def _hostile(r: Router) -> list[dict[str, str]]:
    """What a page of another site, or one reached through a rebound name, can send."""
    return [
        {"Content-Type": "text/plain"},
        {},  # a body without Content-Type
        {"Content-Type": "application/x-www-form-urlencoded", "Origin": "null"},
        {"Content-Type": "text/plain", "Origin": EVIL},
        {"Content-Type": "application/json", "Origin": EVIL},
        {"Content-Type": "application/json", "Host": f"evil.example:{_port(r)}"},
    ]


def _refused(resp: httpx.Response) -> None:
    assert resp.status_code in (403, 415), (resp.status_code, resp.text)
    err = resp.json()["error"]
    assert err["type"] == ("permission_error" if resp.status_code == 403 else "invalid_request_error")
    assert err["code"] == resp.status_code


def test_models_load_and_unload(router: Router) -> None:
    body = b'{"model": "model-a"}'
    for headers in _hostile(router):
        _refused(router.http.post("/models/load", content=body, headers=headers))
    assert router.status("model-a") == "unloaded"  # nothing was started
    # the web UI's own request (same origin, JSON) loads it
    same = {"Origin": router.url, "Content-Type": "application/json"}
    r = router.http.post("/models/load", content=body, headers=same)
    assert r.status_code == 200, r.text
    router.wait_status("model-a", {"loaded"})
    for headers in _hostile(router):
        _refused(router.http.post("/models/unload", content=body, headers=headers))
    assert router.status("model-a") == "loaded"


def test_proxied_slot_files(router: Router, work: Path) -> None:
    """A slot save forwarded to the child: the router refuses what its edge refuses (nothing reaches the
    child); what it accepts, the child (called with its own key, without the page's Origin) does."""
    if router.status("model-a") != "loaded":
        router.load("model-a")
    for headers in _hostile(router):
        r = router.http.post(
            "/slots/0?action=save", content=b'{"model": "model-a", "filename": "cross.bin"}', headers=headers
        )
        _refused(r)
    assert not (work / "slots" / "cross.bin").exists()
    for name, headers in (
        ("plain.bin", {}),
        ("same.bin", {"Origin": router.url}),
        ("local.bin", {"Origin": "http://localhost:5173"}),
    ):
        r = router.http.post(
            "/slots/0?action=save", json={"model": "model-a", "filename": name}, headers=headers
        )
        assert r.status_code == 200, (name, r.text)
        assert (work / "slots" / name).is_file()
    # llama.cpp's erase: no body, no Content-Type (the model named in the query)
    assert router.http.post("/slots/0?action=erase&model=model-a").status_code == 200
    _refused(router.http.post("/slots/0?action=erase&model=model-a", headers={"Origin": EVIL}))
    for path in ("/props", "/lora-adapters"):
        _refused(
            router.http.post(path, content=b'{"model": "model-a"}', headers={"Content-Type": "text/plain"})
        )
        _refused(router.http.post(path, json={"model": "model-a"}, headers={"Origin": EVIL}))


def test_downloads_and_removals(router: Router) -> None:
    for headers in _hostile(router):
        _refused(router.http.post("/models", content=b'{"model": "user/repo:Q4_0"}', headers=headers))
    assert "user/repo:Q4_0" not in {m["id"] for m in router.http.get("/models").json()["data"]}
    for headers in ({"Origin": EVIL}, {"Origin": "null"}, {"Host": f"evil.example:{_port(router)}"}):
        _refused(router.http.delete("/models", params={"model": "model-b"}, headers=headers))
    # the web UI's DELETE (JSON Content-Type, no body) gets to the handler: model-b is no cache entry
    r = router.http.delete(
        "/models", params={"model": "model-b"}, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 500 and "not removable" in r.json()["error"]["message"]


def test_router_tools(router: Router, work: Path) -> None:
    def body(path: Path, text: str) -> bytes:
        return f'{{"tool": "write_file", "params": {{"path": "{path}", "content": "{text}"}}}}'.encode()

    target = work / f"pwned-{uuid.uuid4().hex}.txt"
    for headers in _hostile(router):
        _refused(router.http.post("/tools", content=body(target, "pwned"), headers=headers))
    assert not target.exists()
    marker = work / "ran"
    shell = f'{{"tool": "exec_shell_command", "params": {{"command": "touch {marker}"}}}}'
    for headers in _hostile(router):
        _refused(router.http.post("/tools", content=shell, headers=headers))
    assert not marker.exists()
    for name, headers in (
        ("none", {}),
        ("same", {"Origin": router.url}),
        ("local", {"Origin": "http://localhost:8080"}),
        (
            "localhost-host",
            {"Host": f"localhost:{_port(router)}", "Origin": f"http://localhost:{_port(router)}"},
        ),
    ):
        r = router.http.post(
            "/tools",
            content=body(work / f"{name}.txt", name),
            headers={"Content-Type": "application/json", **headers},
        )
        assert r.status_code == 200, (name, r.text)
        assert (work / f"{name}.txt").read_text() == name
    for method in ("GET", "POST"):  # /cors-proxy: Origin and Host only
        r = router.http.request(
            method, "/cors-proxy", params={"url": "http://example.com/"}, headers={"Origin": EVIL}
        )
        assert r.status_code == 403 and "evil.example" in r.json()["error"]["message"]
        r = router.http.request(
            method, "/cors-proxy", params={"url": "http://example.com/"}, headers={"Host": "evil.example"}
        )
        assert r.status_code == 403 and "evil.example" in r.json()["error"]["message"]


def test_unguarded_routes_and_web_ui(router: Router) -> None:
    hostile = {"Origin": EVIL, "Host": f"evil.example:{_port(router)}"}
    assert router.http.get("/health", headers=hostile).status_code == 200
    assert router.http.get("/").status_code == 200
    assert router.http.get("/models", headers=hostile).status_code == 200


def test_header_names_as_llama_server_spells_them(router: Router) -> None:
    """The router's own answers, its refusals and what it relays from a child (streamed or not) carry
    llama-server's header names, with bodies framed as before (uvicorn's httptools protocol reads
    `Content-Length` and writes the names given)."""
    if router.status("model-a") != "loaded":
        router.load("model-a")
    local = {"Origin": "http://localhost:5173"}
    own = router.http.get("/health", headers=local)
    refused = router.http.post("/tools", content=b"{}", headers={"Content-Type": "text/plain"})
    relayed = router.http.post("/tokenize", json={"model": "model-a", "content": "hi"}, headers=local)
    for r in (own, refused, relayed):
        names = _plain(r)
        assert names["Content-Type"].startswith("application/json"), names
        assert names["Server"] == "llama.cpp"
    for r in (own, refused):
        assert int(_plain(r)["Content-Length"]) == len(r.content)
    assert relayed.headers["transfer-encoding"] == "chunked"  # relayed as it comes
    assert _plain(own)["Access-Control-Allow-Origin"] == "http://localhost:5173"
    assert relayed.json()["tokens"]
    body = {
        "model": "model-a",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "stream": True,
    }
    with router.http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert _plain(r)["Content-Type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    assert text.rstrip().endswith("data: [DONE]")


def test_cors_origins_defaults_to_localhost_with_tools_enabled(router: Router) -> None:
    r = router.http.options("/completions", headers={"Origin": "http://localhost:8080", **PREFLIGHT})
    assert r.status_code == 200 and _plain(r)["Access-Control-Allow-Origin"] == "http://localhost:8080"
    r = router.http.options("/completions", headers={"Origin": "http://evil.com", **PREFLIGHT})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


@pytest.fixture(scope="module")
def localhost_router(models_dir: Path, cache_env: dict[str, str]) -> Iterator[Router]:
    """ServerPreset.router() with `cors_origins = "localhost"`, and an API key."""
    yield from start_router(
        ["--models-dir", str(models_dir), "--cors-origins", "localhost", "--api-key", KEY], cache_env, KEY
    )


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost",
        "http://localhost:8080",
        "http://127.0.0.1",
        "http://127.0.0.1:3000",
        "http://[::1]",
        "http://[::1]:3000",
    ],
)
def test_cors_origins_localhost_reflects(localhost_router: Router, origin: str) -> None:
    r = localhost_router.http.options("/completions", headers={"Origin": origin, **PREFLIGHT})
    assert r.status_code == 200
    assert _plain(r)["Access-Control-Allow-Origin"] == origin
    assert _plain(r)["Access-Control-Allow-Credentials"] == "true"


@pytest.mark.parametrize(
    "origin",
    ["http://web.mydomain.fr", "http://evil.com", "http://notlocalhost", "http://localhost.evil.com"],
)
def test_cors_origins_localhost_rejects(localhost_router: Router, origin: str) -> None:
    r = localhost_router.http.options("/completions", headers={"Origin": origin, **PREFLIGHT})
    assert r.status_code == 200
    assert "access-control-allow-origin" not in r.headers  # in any case


def test_api_key_skips_the_guard(localhost_router: Router) -> None:
    """A request the router's key authenticates passes whatever its Content-Type, Origin and Host (a page
    cannot send the key cross-site without a preflight); without the key, 401."""
    hostile = {
        "Content-Type": "text/plain",
        "Origin": EVIL,
        "Host": f"evil.example:{_port(localhost_router)}",
    }
    body = b'{"model": "no-such-model"}'
    r = localhost_router.http.post("/models/load", content=body, headers=hostile)
    assert r.status_code == 401
    r = localhost_router.http.post("/models/load", content=body, headers={**hostile, **localhost_router.auth})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"  # the handler's answer


@pytest.fixture(scope="module")
def literal_router(models_dir: Path, cache_env: dict[str, str]) -> Iterator[Router]:
    yield from start_router(
        ["--models-dir", str(models_dir), "--cors-origins", "https://app.example"], cache_env
    )


def test_literal_cors_origin(literal_router: Router) -> None:
    body = b'{"model": "no-such-model"}'
    json_type = {"Content-Type": "application/json"}
    for origin in ("https://app.example", literal_router.url):
        r = literal_router.http.post("/models/load", content=body, headers={**json_type, "Origin": origin})
        assert r.status_code == 404, (origin, r.text)  # past the guard: the handler's answer
    for origin in ("http://localhost:5173", "https://app.example.evil", EVIL, "null"):
        r = literal_router.http.post("/models/load", content=body, headers={**json_type, "Origin": origin})
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", (origin, r.text)
    r = literal_router.http.options("/completions", headers={"Origin": EVIL, **PREFLIGHT})
    assert _plain(r)["Access-Control-Allow-Origin"] == "https://app.example"
