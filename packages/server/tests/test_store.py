"""Conversations and responses kept on the server (`--store`), driven with the official `openai` SDK: a
response continued by `previous_response_id` and a conversation continued by its id give exactly what the
same context sent in full gives; stored objects are read back, listed and deleted; each API key sees only
its own; the database survives a restart and a `kill -9` in the middle of writes; it is bounded per key."""

from __future__ import annotations

import signal
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from conftest import Server, assert_error, start_server, stop_server

ARGS = ("-c", "2048", "-np", "2", "--temp", "0", "--no-warmup", "--api-key", "k1,k2")
MAX = 12  # tokens per answer: enough to compare texts, quick on 2 cores


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store") / "state.db"


@pytest.fixture(scope="module")
def stored(db: Path) -> Iterator[Server]:
    s = start_server(db.parent, *ARGS, "--store", str(db))
    yield s
    stop_server(s)


def _sdk(server: Server, key: str = "k1") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)


def _explicit(sdk: openai.OpenAI, items: list[dict], **kw: object) -> tuple[str, int]:
    """The answer and input tokens of a stateless request that sends the whole context itself."""
    r = sdk.responses.create(model="x", input=items, max_output_tokens=MAX, store=False, **kw)  # type: ignore[arg-type]
    assert r.usage is not None
    return r.output_text, r.usage.input_tokens


def test_previous_response_id_continues_the_chain(stored: Server) -> None:
    sdk = _sdk(stored)
    first = sdk.responses.create(model="x", input="Name three colours.", max_output_tokens=MAX)
    assert first.store is True and first.previous_response_id is None
    second = sdk.responses.create(
        model="x", input="Now name a fourth.", previous_response_id=first.id, max_output_tokens=MAX
    )
    assert second.previous_response_id == first.id
    third = sdk.responses.create(
        model="x", input="And a fifth?", previous_response_id=second.id, max_output_tokens=MAX
    )
    # the same context sent in full: the answer and the prompt are identical
    history = [
        {"role": "user", "content": "Name three colours."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Now name a fourth."},
        {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "And a fifth?"},
    ]
    text, n_input = _explicit(sdk, history)
    assert third.usage is not None
    assert (third.output_text, third.usage.input_tokens) == (text, n_input)
    # read back, listed, deleted
    got = sdk.responses.retrieve(third.id)
    assert got.id == third.id and got.output_text == third.output_text
    items = sdk.responses.input_items.list(third.id)
    assert [i.type for i in items.data] == ["message"]
    assert items.data[0].content[0].text == "And a fifth?"  # type: ignore[union-attr]
    sdk.responses.delete(third.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(third.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="x", input="again", previous_response_id=third.id, max_output_tokens=1)


def test_instructions_are_not_carried_over(stored: Server) -> None:
    sdk = _sdk(stored)
    first = sdk.responses.create(
        model="x", input="Say hello.", instructions="Answer in French.", max_output_tokens=MAX
    )
    second = sdk.responses.create(
        model="x", input="Say goodbye.", previous_response_id=first.id, max_output_tokens=MAX
    )
    history = [
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Say goodbye."},
    ]
    assert second.usage is not None
    assert _explicit(sdk, history) == (second.output_text, second.usage.input_tokens)


def test_a_streamed_response_is_stored_before_its_last_event(stored: Server) -> None:
    sdk = _sdk(stored)
    with sdk.responses.stream(model="x", input="Count to five.", max_output_tokens=MAX) as stream:
        final = stream.get_final_response()
    assert final.store is True
    assert sdk.responses.retrieve(final.id).output_text == final.output_text


def test_conversation_holds_the_turns(stored: Server) -> None:
    sdk = _sdk(stored)
    conv = sdk.conversations.create(
        items=[{"type": "message", "role": "system", "content": "You are terse."}],
        metadata={"topic": "fruit"},
    )
    assert conv.metadata == {"topic": "fruit"}
    a = sdk.responses.create(model="x", input="Name a fruit.", conversation=conv.id, max_output_tokens=MAX)
    b = sdk.responses.create(model="x", input="Another one.", conversation=conv.id, max_output_tokens=MAX)
    items = sdk.conversations.items.list(conv.id, order="asc")
    kinds = [(i.type, getattr(i, "role", None)) for i in items.data]
    assert kinds == [("message", "system"), ("message", "user"), ("message", "assistant")] * 1 + [
        ("message", "user"),
        ("message", "assistant"),
    ]
    history = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": a.output_text},
        {"role": "user", "content": "Another one."},
    ]
    assert b.usage is not None
    assert _explicit(sdk, history) == (b.output_text, b.usage.input_tokens)
    # items: one by id, added, deleted; metadata updated; pages
    first = items.data[0]
    assert sdk.conversations.items.retrieve(first.id, conversation_id=conv.id).id == first.id
    added = sdk.conversations.items.create(
        conv.id, items=[{"type": "message", "role": "user", "content": "extra"}]
    )
    assert len(added.data) == 1
    page = sdk.conversations.items.list(conv.id, limit=2)  # newest first
    assert page.has_more and page.data[0].id == added.data[0].id
    after = sdk.conversations.items.list(conv.id, limit=2, after=page.data[1].id)
    assert [i.id for i in after.data] == [i.id for i in items.data[::-1][1:3]]
    sdk.conversations.items.delete(added.data[0].id, conversation_id=conv.id)
    assert len(sdk.conversations.items.list(conv.id).data) == 5
    assert sdk.conversations.update(conv.id, metadata={"topic": "veg"}).metadata == {"topic": "veg"}
    assert sdk.conversations.delete(conv.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        sdk.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="x", input="hi", conversation=conv.id, max_output_tokens=1)


def test_bad_requests(stored: Server) -> None:
    with stored.client() as c:
        c.headers["Authorization"] = "Bearer k1"
        assert_error(c.post("/v1/conversations", json={"metadata": {"k": 1}}), 400)
        assert_error(c.post("/v1/conversations", json={"metadata": {str(i): "v" for i in range(17)}}), 400)
        assert_error(c.post("/v1/conversations", json={"items": [{"type": "bogus"}]}), 400)
        many = [{"role": "user", "content": "x"}] * 21
        assert_error(c.post("/v1/conversations", json={"items": many}), 400)
        assert_error(c.post("/v1/conversations", content=b"[1]"), 400)
        assert_error(c.get("/v1/conversations/conv_nope/items?limit=0"), 400)
        assert_error(c.get("/v1/conversations/conv_nope"), 404, "not_found_error")
        both = {"input": "x", "previous_response_id": "resp_1", "conversation": "conv_1"}
        assert_error(c.post("/v1/responses", json=both), 400)
        assert_error(c.post("/v1/responses", json={"input": "x", "store": "yes"}), 400)


def test_each_key_sees_only_its_own(stored: Server) -> None:
    k1, k2 = _sdk(stored, "k1"), _sdk(stored, "k2")
    resp = k1.responses.create(model="x", input="A secret: 4 8 15.", max_output_tokens=2)
    conv = k1.conversations.create(items=[{"type": "message", "role": "user", "content": "private"}])
    for call in (
        lambda: k2.responses.retrieve(resp.id),
        lambda: k2.responses.input_items.list(resp.id),
        lambda: k2.responses.delete(resp.id),
        lambda: k2.responses.create(model="x", input="?", previous_response_id=resp.id, max_output_tokens=1),
        lambda: k2.conversations.retrieve(conv.id),
        lambda: k2.conversations.items.list(conv.id),
        lambda: k2.conversations.items.create(conv.id, items=[{"role": "user", "content": "x"}]),
        lambda: k2.conversations.update(conv.id, metadata={}),
        lambda: k2.conversations.delete(conv.id),
        lambda: k2.responses.create(model="x", input="?", conversation=conv.id, max_output_tokens=1),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    with httpx.Client(base_url=stored.base_url, headers={"Authorization": "Bearer k2"}) as c:
        assert conv.id not in c.get("/v1/conversations").text
    assert k1.conversations.retrieve(conv.id).id == conv.id  # untouched by k2's attempts
    assert len(k1.conversations.items.list(conv.id).data) == 1
    with httpx.Client(base_url=stored.base_url) as c:  # no key at all
        assert c.get(f"/v1/conversations/{conv.id}").status_code == 401


def test_without_a_store(client: httpx.Client) -> None:
    """The shared server has no --store: llama-server's answers."""
    err = assert_error(client.post("/v1/responses", json={"input": "x", "previous_response_id": "r"}), 400)
    assert err["message"] == "llama.cpp does not support 'previous_response_id'."
    assert_error(client.get("/v1/responses/resp_1"), 501, "not_supported_error")
    assert_error(client.post("/v1/conversations", json={}), 501, "not_supported_error")
    r = client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 2})
    assert r.status_code == 200 and "store" not in r.json() and "previous_response_id" not in r.json()


def test_restart_and_kill_during_writes(db: Path, stored: Server, tmp_path: Path) -> None:
    """A second stored on the same database (the module's is stopped first) reads what the first kept; a
    `kill -9` while clients write leaves a sound database that holds whole items only."""
    sdk = _sdk(stored)
    kept = sdk.responses.create(model="x", input="Remember me.", max_output_tokens=4)
    conv = sdk.conversations.create()
    stop_server(stored)
    s2 = start_server(tmp_path, *ARGS, "--store", str(db))
    try:
        again = _sdk(s2)
        assert again.responses.retrieve(kept.id).output_text == kept.output_text
        stop = threading.Event()
        written: list[int] = []

        def writer() -> None:
            c = _sdk(s2)
            while not stop.is_set():
                try:
                    c.conversations.items.create(
                        conv.id, items=[{"role": "user", "content": "x" * 2000}] * 20
                    )
                    written.append(20)
                except (openai.APIConnectionError, openai.APIStatusError):
                    return

        threads = [threading.Thread(target=writer) for _ in range(3)]
        for t in threads:
            t.start()
        while sum(written) < 200:
            threading.Event().wait(0.02)
        s2.proc.send_signal(signal.SIGKILL)
        s2.proc.wait()
        stop.set()
        for t in threads:
            t.join()
    finally:
        if s2.proc.poll() is None:
            stop_server(s2)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    n = con.execute("SELECT COUNT(*) FROM items WHERE conversation = ?", (conv.id,)).fetchone()[0]
    assert n % 20 == 0 and n >= sum(written)  # whole requests only: each is one transaction
    con.close()
    s3 = start_server(tmp_path, *ARGS, "--store", str(db))
    try:
        page = _sdk(s3).conversations.items.list(conv.id, limit=100)
        assert all(i.content[0].text == "x" * 2000 for i in page.data)  # type: ignore[union-attr]
    finally:
        stop_server(s3)


def test_quota_and_bad_database(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(RuntimeError, match="cannot open the database"):
        start_server(tmp_path, "--store", str(bad), timeout=60)
    s = start_server(tmp_path, "--no-warmup", "--store", str(tmp_path / "q.db"), "--store-quota", "1")
    try:
        sdk = _sdk(s, "none")
        conv = sdk.conversations.create()
        with pytest.raises(openai.APIStatusError) as info:
            for _ in range(100):  # 20 x 3 kB a call: the 1 MiB quota is reached within ~18 calls
                sdk.conversations.items.create(conv.id, items=[{"role": "user", "content": "y" * 3000}] * 20)
        assert info.value.status_code == 413 and "store is full" in info.value.message
        with pytest.raises(openai.APIStatusError) as info:
            sdk.responses.create(model="x", input="hi", max_output_tokens=1)
        assert info.value.status_code == 413
        sdk.responses.create(model="x", input="hi", max_output_tokens=1, store=False)  # stateless still works
        sdk.conversations.delete(conv.id)  # deleting frees the room
        sdk.conversations.create(items=[{"role": "user", "content": "fits again"}])
    finally:
        stop_server(s)


def test_store_bounds_and_chains(tmp_path: Path) -> None:
    """The store alone: empty conversations count against the quota too, deleting gives the room back, a
    chain through a deleted response starts after it, pages follow `after`."""
    from llama_server.errors import ApiError
    from llama_server.store import Store

    st = Store(tmp_path / "s.db", quota_bytes=10_000)
    made = []
    with pytest.raises(ApiError) as info:
        for _ in range(1000):
            made.append(st.create_conversation("me", [], {"name": "x" * 100})["id"])
    assert info.value.code == 413 and 20 < len(made) < 40
    assert st.used("me") >= 10_000 and st.used("other") == 0
    for conv in made:
        st.delete_conversation("me", conv)
    assert st.used("me") == 0
    conv = st.create_conversation("me", [], {})["id"]
    assert st.list_conversations("other", 20, "desc", None).data == []

    def respond(rid: str, prev: str | None, text: str) -> None:
        body = {
            "id": rid,
            "created_at": 0,
            "previous_response_id": prev,
            "output": [{"id": f"o{rid}", "text": text}],
        }
        st.save_response("me", body, [{"id": f"i{rid}", "type": "message"}], keep=True, conversation=None)

    respond("r1", None, "a")
    respond("r2", "r1", "b")
    respond("r3", "r2", "c")
    assert [i["id"] for i in st.context("me", "r3")] == ["ir1", "or1", "ir2", "or2", "ir3", "or3"]
    st.delete_response("me", "r2")
    assert [i["id"] for i in st.context("me", "r3")] == ["ir3", "or3"]
    with pytest.raises(ApiError):
        st.context("other", "r3")
    items = [{"id": f"m{i}", "type": "message", "role": "user", "content": []} for i in range(7)]
    st.add_items("me", conv, items)
    page = st.list_items("me", conv, 3, "asc", None)
    assert [i["id"] for i in page.data] == ["m0", "m1", "m2"] and page.has_more
    page = st.list_items("me", conv, 3, "asc", "m5")
    assert [i["id"] for i in page.data] == ["m6"] and not page.has_more
    # the web UI's extension: an item's metadata object is kept, and an item can be replaced in place
    from llama_server.store import normalize_items

    before = st.used("me")
    new = normalize_items(
        [{"role": "assistant", "content": "done", "metadata": {"message": {"status": "ok"}}}]
    )[0]
    st.replace_item("me", conv, "m3", new)
    got = st.get_item("me", conv, "m3")
    assert got["metadata"] == {"message": {"status": "ok"}} and got["content"][0]["text"] == "done"
    assert [i["id"] for i in st.list_items("me", conv, 10, "asc", None).data][3] == "m3"  # same place
    assert st.used("me") > before
    with pytest.raises(ApiError):
        st.replace_item("other", conv, "m3", new)
    with pytest.raises(ApiError):
        normalize_items([{"role": "user", "content": "x", "metadata": "not an object"}])
    st.close()
