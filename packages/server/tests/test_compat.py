"""llama-server compatibility against a real server: header case, templates by name, thinking."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from conftest import Server, start_server, stop_server


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("compat"), "-c", "1024", "-np", "2", "--temp", "0", "--metrics")
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def c(srv: Server) -> Iterator[httpx.Client]:
    with srv.client() as client:
        yield client


def _raw_names(r: httpx.Response) -> list[str]:
    return [k.decode() for k, _ in r.headers.raw]


def test_header_names_in_canonical_case(c):
    r = c.options("/v1/models", headers={"Origin": "http://localhost:3000"})
    names = _raw_names(r)
    for name in (
        "Access-Control-Allow-Origin",
        "Access-Control-Allow-Credentials",
        "Access-Control-Allow-Methods",
        "Access-Control-Allow-Headers",
        "Content-Type",
        "Server",
    ):
        assert name in names, names
    r = c.get("/metrics")
    assert "Process-Start-Time-Unix" in _raw_names(r)
    r = c.post("/completion", json={"prompt": "Hi", "n_predict": 1})
    assert "Content-Type" in _raw_names(r) and "content-type" not in _raw_names(r)
    assert dict(r.headers.raw)[b"Server"] == b"llama.cpp"
    r = c.get("/nope")  # errors too
    assert r.status_code == 404 and "Content-Type" in _raw_names(r)
