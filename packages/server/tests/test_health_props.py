"""GET /health, /props, /v1/models, /slots, /metrics; CORS, headers, unknown routes."""

from __future__ import annotations

from conftest import assert_error


def test_health_and_loading(server, client):
    assert server.saw_loading  # /health answered 503 "Loading model" before the model was ready
    r = client.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert r.headers["server"] == "llama.cpp"
    assert client.get("/v1/health").json() == {"status": "ok"}


def test_props(client):
    p = client.get("/props").json()
    assert p["total_slots"] == 4
    assert p["model_alias"] == "smol"
    assert p["default_generation_settings"]["n_ctx"] == 2048
    params = p["default_generation_settings"]["params"]
    assert params["temperature"] == 0.0 and params["n_predict"] == -1 and "stop" not in params
    assert p["chat_template"].startswith("{% for message in messages %}")
    assert p["bos_token"] == "<|im_start|>" and p["eos_token"] == "<|im_end|>"
    assert p["endpoint_metrics"] is True and p["build_info"].startswith("b")
    assert client.post("/props", json={}).json() == {"success": True}


def test_models(client):
    body = client.get("/v1/models").json()
    assert body == client.get("/models").json()
    m = body["data"][0]
    assert m["id"] == "smol" and m["aliases"] == ["smol", "tiny"] and m["owned_by"] == "llamacpp"
    assert m["meta"]["n_vocab"] == 49152 and m["meta"]["n_ctx_train"] == 8192 and m["meta"]["ftype"] == "Q4_1"
    assert body["object"] == "list" and body["models"][0]["name"] == "smol"


def test_slots(client):
    slots = client.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    assert all(s["n_ctx"] == 2048 and s["is_processing"] is False for s in slots)
    assert client.get("/slots", params={"fail_on_no_slot": "1"}).status_code == 200


def test_slot_actions_validate(client):
    assert_error(client.post("/slots/abc?action=save", json={"filename": "a.bin"}), 400)
    assert_error(client.post("/slots/-1?action=save", json={"filename": "a.bin"}), 400)
    assert_error(client.post("/slots/0?action=explode"), 400)
    assert_error(client.post("/slots/0?action=save", json={"filename": "../etc/passwd"}), 400)
    assert_error(client.post("/slots/0?action=save", json={"filename": "a/b.bin"}), 400)


def test_metrics(client):
    client.post("/completion", json={"prompt": "Hi", "n_predict": 1})
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "process-start-time-unix" in r.headers
    text = r.text
    for name in (
        "prompt_tokens_total",
        "tokens_predicted_total",
        "n_decode_total",
        "requests_processing",
        "requests_deferred",
        "predicted_tokens_seconds",
    ):
        assert f"# TYPE llamacpp:{name} " in text
    values = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("llamacpp:")}
    assert values["llamacpp:tokens_predicted_total"] >= 1
    assert text.index("counter") < text.index("gauge")


def test_unknown_route_and_method(client):
    r = client.get("/nope")
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}


def test_cors(client):
    r = client.options("/v1/chat/completions", headers={"Origin": "http://example.com"})
    assert r.status_code == 200 and r.text == ""
    assert r.headers["access-control-allow-origin"] == "http://example.com"
    assert r.headers["access-control-allow-credentials"] == "true"
    assert "POST" in r.headers["access-control-allow-methods"]
    r = client.get("/health", headers={"Origin": "localhost"})
    assert r.headers["access-control-allow-origin"] == "localhost"
