"""POST /slots/{id}?action=save|restore|erase on the shared server (4 slots, --slot-save-path set),
prompt-only requests (n_predict 0) and per-token timings."""

from __future__ import annotations

import json

import pytest
from conftest import assert_error, sse_events

# a prompt no other test uses, so no other slot holds a prefix of it
PROMPT = "Slot files keep a conversation: the quick brown fox jumps over the lazy dog, and then"


def _complete(client, slot: int, n: int = 8) -> dict:
    r = client.post(
        "/completion", json={"prompt": PROMPT, "n_predict": n, "id_slot": slot, "cache_prompt": True}
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_save_erase_restore_then_reuse(client, server):
    first = _complete(client, 3)
    n_prompt = first["tokens_evaluated"]
    r = client.post("/slots/3?action=save", json={"filename": "fox.bin"})
    assert r.status_code == 200, r.text
    saved = r.json()
    assert list(saved) == ["id_slot", "filename", "n_saved", "n_written", "timings"]
    assert saved["id_slot"] == 3 and saved["filename"] == "fox.bin"
    assert saved["n_saved"] == n_prompt + 8 - 1 == first["tokens_cached"]
    assert saved["n_written"] == (server.slots_dir / "fox.bin").stat().st_size
    assert saved["timings"]["save_ms"] >= 0

    r = client.post("/slots/7?action=erase")  # ids wrap modulo the slot count: 7 is slot 3
    assert r.json() == {"id_slot": 3, "n_erased": saved["n_saved"]}
    assert client.post("/slots/3?action=erase").json() == {"id_slot": 3, "n_erased": 0}

    r = client.post("/slots/3?action=restore", json={"filename": "fox.bin"})
    assert r.status_code == 200, r.text
    restored = r.json()
    assert list(restored) == ["id_slot", "filename", "n_restored", "n_read", "timings"]
    assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]
    assert restored["timings"]["restore_ms"] >= 0

    again = _complete(client, 3)
    assert again["content"] == first["content"]  # greedy: the restored cache gives the same text
    assert again["timings"]["cache_n"] == n_prompt - 1  # everything but the last prompt token was reused
    assert again["timings"]["prompt_n"] == 1 < first["timings"]["prompt_n"]


def test_failed_restore_leaves_the_slot(client, server):
    _complete(client, 2, n=2)
    (server.slots_dir / "junk.bin").write_bytes(b"LLPYSEQ\0" + b"\x01" * 64)
    for name, reason in (("junk.bin", "Unable to restore slot: "), ("absent.bin", "file not found")):
        err = assert_error(client.post("/slots/2?action=restore", json={"filename": name}), 400)
        assert err["message"].startswith("Unable to restore slot: ") and reason in err["message"]
    again = _complete(client, 2, n=2)
    assert again["timings"]["cache_n"] > 0  # the slot still holds its cache


@pytest.mark.parametrize(
    "name",
    [
        "../x.bin",
        "a/b.bin",
        "a\\b.bin",
        "..",
        ".",
        "a..b",
        " lead.bin",
        "trail.bin ",
        "trail.",
        "",
        "c\x01.bin",
        "x" * 256,
        "é" * 128,
    ],
)
def test_invalid_filenames(client, name):
    body = json.dumps({"filename": name}).encode()
    r = client.post("/slots/0?action=save", content=body, headers={"Content-Type": "application/json"})
    assert assert_error(r, 400, "invalid_request_error")["message"] == "Invalid filename"


def test_invalid_requests(client):
    assert assert_error(client.post("/slots/0?action=save", json={}), 400)["message"] == "Invalid filename"
    assert assert_error(client.post("/slots/x?action=erase"), 400)["message"] == "Invalid slot ID"
    assert assert_error(client.post("/slots/-1?action=erase"), 400)["message"] == "Invalid slot ID"
    assert assert_error(client.post("/slots/0?action=nap"), 400)["message"] == "Invalid action"
    assert assert_error(client.post("/slots/0"), 400)["message"] == "Invalid action"


def test_prompt_only_completion(client):
    r = client.post("/completion", json={"prompt": PROMPT + " more", "n_predict": 0})
    body = r.json()
    assert body["content"] == "" and body["tokens_predicted"] == 0 and body["stop_type"] == "limit"
    t = body["timings"]
    assert t["predicted_n"] == 0 and t["prompt_n"] + t["cache_n"] == body["tokens_evaluated"]


def test_timings_per_token_in_streams(client):
    r = client.post(
        "/completion", json={"prompt": PROMPT, "n_predict": 3, "stream": True, "timings_per_token": True}
    )
    events = [json.loads(e) for e in sse_events(r.text)]
    assert [e["timings"]["predicted_n"] for e in events[:-1]] == [1, 2, 3]
    assert events[-1]["generation_settings"]["timings_per_token"] is True
    r = client.post("/completion", json={"prompt": PROMPT, "n_predict": 2, "stream": True})
    assert all("timings" not in json.loads(e) for e in sse_events(r.text)[:-1])
    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 3,
            "stream": True,
            "timings_per_token": True,
        },
    )
    chunks = [json.loads(e) for e in sse_events(r.text) if e != "[DONE]"]
    assert any("timings" in c and c["choices"][0]["finish_reason"] is None for c in chunks)
