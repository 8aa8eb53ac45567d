"""Request-wide size limits are applied before any tokenizing (in-process app, SmolLM2's real tokenizer
with a call counter, a stand-in engine that only holds requests)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import assert_error, smollm2_path
from litestar.testing import TestClient

import gguf_io
from llama_engine import FinalEvent, RequestHandle, StopReason, Timings, Usage
from llama_engine.tokenizer import Tokenizer
from llama_server import ServerConfig, ServerState, create_app
from llama_server.params import MAX_BIAS_TEXT_CHARS
from llama_server.prompts import MAX_PROMPTS, MAX_REQUEST_CHARS, MAX_TEXT_PIECES


class CountingTokenizer(Tokenizer):
    """SmolLM2's tokenizer, counting the texts it is asked to encode."""

    __slots__ = ()
    calls = 0

    def encode(self, *args, **kwargs):  # type: ignore[override]
        type(self).calls += 1
        return super().encode(*args, **kwargs)


class InstantEngine:
    """Looks like an Engine that records every request and finishes it at once, with no tokens."""

    n_ctx_slot = 8192

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.gguf = SimpleNamespace(metadata={}, header=SimpleNamespace(architecture="llama"))
        self.steps = 0
        self.n_waiting = 0
        self.submitted: list = []

    def slots(self) -> list:
        return []

    def submit(self, req, on_event=None):
        self.submitted.append(req)
        handle = RequestHandle(on_event)
        handle._emit(FinalEvent(StopReason.LENGTH, Usage(len(req.prompt), 0), Timings(0, 0.0, 0, 0.0, 0)))
        return handle

    def submit_embedding(self, req):
        raise AssertionError("an oversized embedding request must be refused before it is submitted")

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def tokenizer() -> CountingTokenizer:
    with gguf_io.open(smollm2_path()) as f:
        tok = Tokenizer.from_gguf(f.tokenizer)
    tok.__class__ = CountingTokenizer
    return tok  # type: ignore[return-value]


@pytest.fixture
def app(tokenizer):
    engine = InstantEngine(tokenizer)
    state = ServerState(ServerConfig(model="m.gguf", embeddings=True, pooling="mean"), engine=engine)
    with TestClient(create_app(state)) as c:
        c.engine = engine  # type: ignore[attr-defined]
        yield c


def _refused(c, path: str, body: dict, *words: str) -> str:
    before = CountingTokenizer.calls
    err = assert_error(c.post(path, json=body), 400, "invalid_request_error")
    assert CountingTokenizer.calls == before, "text was tokenized before the request was refused"
    assert not c.engine.submitted
    for w in words:
        assert w in err["message"], err["message"]
    return err["message"]


def test_batch_of_long_prompts_is_refused_before_tokenizing(app):
    """The fault run's case: 64 prompts of 160,000 characters, each under the context check on its own."""
    prompts = ["x" * 160_000] * MAX_PROMPTS
    _refused(app, "/completion", {"prompt": prompts, "n_predict": 1}, str(MAX_REQUEST_CHARS), "characters")
    _refused(app, "/v1/completions", {"prompt": prompts, "max_tokens": 1}, str(MAX_REQUEST_CHARS))


def test_batch_under_the_limit_is_served(app):
    r = app.post("/completion", json={"prompt": ["Hello", "x" * 1000], "n_predict": 1})
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()) == 2 and len(app.engine.submitted) == 2


def test_logit_bias_text_keys_together(app):
    keys = {f"word{i} " * 8: -1.0 for i in range(2048)}  # each short, all of them together too long
    assert sum(map(len, keys)) > MAX_BIAS_TEXT_CHARS
    msg = _refused(app, "/completion", {"prompt": "Hi", "logit_bias": keys}, str(MAX_BIAS_TEXT_CHARS))
    assert "logit_bias" in msg
    pairs = [[k, False] for k in keys]  # the list form counts the same
    _refused(app, "/completion", {"prompt": "Hi", "logit_bias": pairs}, "logit_bias")
    chat = {"messages": [{"role": "user", "content": "Hi"}], "logit_bias": keys}
    _refused(app, "/v1/chat/completions", chat, "logit_bias")


def test_logit_bias_ids_are_not_text(app):
    """Token ids written as strings are not tokenized and do not count against the text limit."""
    bias = {str(i): -1.0 for i in range(4096)}
    r = app.post("/completion", json={"prompt": "Hi", "logit_bias": bias, "n_predict": 1})
    assert r.status_code == 200, r.text[:300]
    assert len(app.engine.submitted[0].sampling.logit_bias) == 4096


def test_tokenize_list_form(app):
    """A 3 MB list `content` of short strings: refused by its number of strings, before any tokenizing."""
    content = ["a"] * 600_000
    _refused(app, "/tokenize", {"content": content}, str(MAX_TEXT_PIECES), "strings")
    _refused(app, "/tokenize", {"content": ["y" * 600_000, "z" * 600_000]}, str(MAX_REQUEST_CHARS))
    ids = app.post("/tokenize", json={"content": [1, "Hello"] * 100}).json()["tokens"]
    assert ids[:1] == [1] and len(ids) >= 200


def test_tokenize_string_form(app):
    _refused(app, "/tokenize", {"content": "w" * (MAX_REQUEST_CHARS + 1)}, str(MAX_REQUEST_CHARS))


def test_embeddings_inputs_together(app):
    _refused(app, "/v1/embeddings", {"input": ["e" * 20_000] * 64}, str(MAX_REQUEST_CHARS))
    _refused(app, "/embedding", {"content": ["e" * 20_000] * 64}, str(MAX_REQUEST_CHARS))


def test_chat_messages_together(app):
    messages = [{"role": "user", "content": "m" * 30_000}] * 40
    _refused(app, "/v1/chat/completions", {"messages": messages}, str(MAX_REQUEST_CHARS))
    _refused(app, "/apply-template", {"messages": messages}, str(MAX_REQUEST_CHARS))
