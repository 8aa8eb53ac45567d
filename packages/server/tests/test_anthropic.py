"""POST /v1/messages (streaming and not) and /v1/messages/count_tokens with the anthropic SDK."""

from __future__ import annotations

import anthropic
import pytest
from conftest import sse_events

MSG = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_messages(claude):
    m = claude.messages.create(model="x", max_tokens=3, messages=MSG, system="Be brief.")
    assert m.type == "message" and m.role == "assistant" and m.model == "smol"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_messages_stream(claude):
    with claude.messages.stream(model="x", max_tokens=3, messages=MSG) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text and final.stop_reason == "max_tokens"


def test_stream_event_order(client):
    r = client.post("/v1/messages", json={"max_tokens": 2, "messages": MSG, "stream": True})
    names = [ln[7:] for ln in r.text.split("\n") if ln.startswith("event: ")]
    assert names[0] == "message_start" and names[1] == "content_block_start"
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert len(sse_events(r.text)) == len(names) and "[DONE]" not in r.text


def test_count_tokens(claude, client):
    n = claude.messages.count_tokens(model="x", messages=MSG).input_tokens
    ref = client.post("/v1/chat/completions/input_tokens", json={"messages": MSG}).json()["input_tokens"]
    assert n == ref > 0


def test_messages_required(client):
    r = client.post("/v1/messages", json={"max_tokens": 2})
    assert r.status_code == 500 and r.json()["error"]["message"] == "'messages' is required"
