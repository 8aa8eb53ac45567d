"""POST /v1/responses (OpenAI Responses API) with the openai SDK."""

from __future__ import annotations

import openai
import pytest
from conftest import assert_error


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_response(oai):
    r = oai.responses.create(model="x", input="Hi", max_output_tokens=3, temperature=0)
    assert r.id.startswith("resp_") and r.status == "completed"
    assert r.output[0].type == "message" and r.output_text
    assert r.usage.output_tokens == 3 and r.usage.total_tokens == r.usage.input_tokens + 3


def test_response_stream(oai):
    events = list(
        oai.responses.create(model="x", input="Hi", max_output_tokens=3, temperature=0, stream=True)
    )
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].response.output[0].content[0].text == text


def test_response_items_and_errors(client):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]
    r = client.post("/v1/responses/input_tokens", json={"input": items, "instructions": "Be brief."})
    assert r.json()["input_tokens"] > 0 and r.json()["object"] == "response.input_tokens"
    assert_error(client.post("/v1/responses", json={}), 400)
    assert_error(client.post("/v1/responses", json={"input": "x", "previous_response_id": "resp_1"}), 400)
    assert_error(client.post("/v1/responses", json={"input": [{"type": "mystery"}]}), 400)
