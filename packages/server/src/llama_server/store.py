"""Conversations and responses kept on the server (`--store PATH`): one SQLite database in WAL mode.

OpenAI's Conversations API (a conversation and its items) and the state of the Responses API (a stored
response, its input items, the chain of `previous_response_id`) live here. Every row belongs to the API
key that made it (`llama_tools.auth.key_scope`: a digest of the key, "" without keys); every lookup is by
(owner, id), so another key's objects are simply not found.

Each change is one transaction, so a crash or `kill -9` at any moment leaves the database as it was
before or after that change (SQLite's WAL journal), never half-written. Each owner holds at most
`quota_bytes` of conversations (ROW_BYTES each, with their metadata's JSON), items and responses (their
JSON); a request that finds its owner at the quota is refused before any work, so one response may
overshoot it by its own size.

The methods block (SQLite I/O): handlers call the readers through a worker thread. Writes made when a
response completes run on the event loop, so the object is stored before its last event is sent.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import ApiError
from .generation import random_id

__all__ = [
    "MAX_ITEMS_PER_CALL",
    "Page",
    "Store",
    "check_metadata",
    "normalize_items",
]

SCHEMA_VERSION = 1
MAX_ITEMS_PER_CALL = 20  # OpenAI's limit on items given when creating a conversation or adding items
MAX_CHAIN = 100_000  # responses followed back along previous_response_id (a chain is acyclic by making)
ROW_BYTES = 256  # what a conversation itself counts against the quota, beside its metadata's JSON

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS conversations_by_owner ON conversations(owner, created_at);
CREATE TABLE IF NOT EXISTS items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    data TEXT NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS items_by_conversation ON items(conversation, seq);
CREATE INDEX IF NOT EXISTS items_by_id ON items(conversation, id);
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    previous TEXT,
    body TEXT NOT NULL,
    input TEXT NOT NULL,
    size INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS usage (
    owner TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL
);
"""


def _not_found(kind: str, obj_id: str) -> ApiError:
    return ApiError(f"{kind} with id '{obj_id}' not found.", "not_found_error")


def _full(quota: int) -> ApiError:
    size = f"{quota >> 20} MiB" if quota >= 1 << 20 else f"{quota} bytes"
    return ApiError(
        f"the store is full for this API key ({size}): delete conversations or responses to make room",
        code=413,
    )


def _owned_size(db: sqlite3.Connection, table: str, kind: str, owner: str, obj_id: str) -> int:
    """The quota size of the owner's row `obj_id` of `table` (conversations, responses); 404 when absent."""
    row = db.execute(f"SELECT size FROM {table} WHERE id = ? AND owner = ?", (obj_id, owner)).fetchone()
    if row is None:
        raise _not_found(kind, obj_id)
    return int(row[0])


def _json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# -- items -------------------------------------------------------------------------------------------------

_MESSAGE_ROLES = ("user", "system", "developer", "assistant")


def _parts(content: Any, role: str) -> list[dict[str, Any]]:
    text_kind = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        return [{"type": text_kind, "text": content}]
    if not isinstance(content, list):
        raise ApiError("'content' must be a string or an array of parts")
    out = []
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ApiError("content parts must be objects with a 'type'")
        if part["type"] in ("input_text", "output_text", "refusal", "reasoning_text") and not isinstance(
            part.get("text", part.get("refusal")), str
        ):
            raise ApiError(f"a '{part['type']}' part needs its text as a string")
        out.append(part)
    return out


def _normalize(item: Any) -> dict[str, Any]:
    """An input item in the shape OpenAI lists it (type, id, status), with a fresh id when it has none, and
    its `metadata` object when it has one (an extension: what a client keeps beside the item, such as the
    web UI's message)."""
    if not isinstance(item, dict):
        raise ApiError("Cannot determine type of 'item'")
    out = _shape(item)
    meta = item.get("metadata")
    if meta is not None:
        if not isinstance(meta, dict):
            raise ApiError("an item's 'metadata' must be an object")
        out["metadata"] = meta
    return out


def _shape(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message" if "role" in item else None)
    given = item.get("id")
    if given is not None and (not isinstance(given, str) or not 0 < len(given) <= 128):
        raise ApiError("an item's 'id' must be a string of 1 to 128 characters")
    if kind == "message":
        role = item.get("role")
        if role not in _MESSAGE_ROLES:
            raise ApiError(f"unsupported message role: {role!r}")
        content = _parts(item.get("content", ""), role)
        return {"type": "message", "id": given or "msg_" + random_id(), "status": "completed", "role": role,
                "content": content}  # fmt: skip
    if kind == "function_call":
        fields = {k: item.get(k) for k in ("call_id", "name", "arguments")}
        if not all(isinstance(v, str) for v in fields.values()):
            raise ApiError("a function_call item needs 'call_id', 'name' and 'arguments' strings")
        return {"type": kind, "id": given or "fc_" + random_id(), "status": "completed", **fields}
    if kind == "function_call_output":
        out = item.get("output")
        if not isinstance(item.get("call_id"), str) or not isinstance(out, (str, list)):
            raise ApiError("a function_call_output item needs a 'call_id' string and an 'output'")
        return {"type": kind, "id": given or "fco_" + random_id(), "status": "completed",
                "call_id": item["call_id"], "output": out}  # fmt: skip
    if kind == "reasoning":
        summary, content = item.get("summary", []), item.get("content", [])
        if not isinstance(summary, list) or not isinstance(content, list):
            raise ApiError("a reasoning item's 'summary' and 'content' must be arrays")
        return {"type": kind, "id": given or "rs_" + random_id(), "summary": summary, "content": content}
    raise ApiError("Cannot determine type of 'item'")


def normalize_items(items: Any) -> list[dict[str, Any]]:
    """Input items (a Responses `input` string is one user message) as they are stored and listed."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ApiError("'items' must be an array")
    return [_normalize(i) for i in items]


def check_metadata(metadata: Any) -> dict[str, str]:
    """OpenAI's metadata: at most 16 pairs, keys up to 64 characters, string values up to 512."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise ApiError("'metadata' must be an object")
    if len(metadata) > 16:
        raise ApiError("'metadata' holds at most 16 key-value pairs")
    for k, v in metadata.items():
        if len(k) > 64:
            raise ApiError("'metadata' keys are at most 64 characters")
        if not isinstance(v, str) or len(v) > 512:
            raise ApiError(f"'metadata' value of '{k[:64]}' must be a string of at most 512 characters")
    return dict(metadata)


class Page:
    """A list page in OpenAI's shape."""

    def __init__(self, data: list[dict[str, Any]], has_more: bool) -> None:
        self.data, self.has_more = data, has_more

    def body(self) -> dict[str, Any]:
        ids = [d.get("id") for d in self.data]
        return {
            "object": "list",
            "data": self.data,
            "first_id": ids[0] if ids else None,
            "last_id": ids[-1] if ids else None,
            "has_more": self.has_more,
        }


def _page_args(limit: int, order: str) -> tuple[int, str]:
    if not 1 <= limit <= 100:
        raise ApiError("'limit' must be between 1 and 100")
    if order not in ("asc", "desc"):
        raise ApiError("'order' must be 'asc' or 'desc'")
    return limit, order


class Store:
    """The database of one server. Thread-safe: one connection, one lock."""

    def __init__(self, path: str | Path, quota_bytes: int = 256 << 20) -> None:
        self.path = Path(path)
        self.quota_bytes = quota_bytes
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: a process crash never loses a commit
            self._db.execute("PRAGMA foreign_keys=ON")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ValueError(f"it was written by a newer version (schema {version} > {SCHEMA_VERSION})")
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except (sqlite3.Error, ValueError) as e:
            raise ValueError(f"--store {self.path}: cannot open the database: {e}") from e

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # -- quota -------------------------------------------------------------------------------------------

    def used(self, owner: str) -> int:
        with self._lock:
            return self._used(self._db, owner)

    @staticmethod
    def _used(db: sqlite3.Connection, owner: str) -> int:
        row = db.execute("SELECT bytes FROM usage WHERE owner = ?", (owner,)).fetchone()
        return int(row[0]) if row else 0

    def check_room(self, owner: str) -> None:
        """Refuse new state when the owner is at the quota (a 413 before any work is done)."""
        if self.used(owner) >= self.quota_bytes:
            raise _full(self.quota_bytes)

    @staticmethod
    def _charge(db: sqlite3.Connection, owner: str, delta: int) -> None:
        db.execute(
            "INSERT INTO usage(owner, bytes) VALUES(?, ?) ON CONFLICT(owner) DO UPDATE SET bytes = bytes + ?",
            (owner, delta, delta),
        )

    # -- conversations -----------------------------------------------------------------------------------

    @staticmethod
    def _conversation(row: tuple[Any, ...]) -> dict[str, Any]:
        return {"id": row[0], "object": "conversation", "created_at": row[1], "metadata": json.loads(row[2])}

    def create_conversation(
        self, owner: str, items: list[dict[str, Any]], metadata: dict[str, str]
    ) -> dict[str, Any]:
        self.check_room(owner)
        conv_id, created = "conv_" + random_id(), int(time.time())
        meta = _json(metadata)
        size = ROW_BYTES + len(meta.encode())
        with self._tx() as db:
            db.execute(
                "INSERT INTO conversations(id, owner, created_at, metadata, size) VALUES(?, ?, ?, ?, ?)",
                (conv_id, owner, created, meta, size),
            )
            self._charge(db, owner, size)
            self._append(db, owner, conv_id, items)
        return {"id": conv_id, "object": "conversation", "created_at": created, "metadata": metadata}

    def get_conversation(self, owner: str, conv_id: str) -> dict[str, Any]:
        rows = self._read(
            "SELECT id, created_at, metadata FROM conversations WHERE id = ? AND owner = ?", conv_id, owner
        )
        if not rows:
            raise _not_found("Conversation", conv_id)
        return self._conversation(rows[0])

    def list_conversations(self, owner: str, limit: int, order: str, after: str | None) -> Page:
        limit, order = _page_args(limit, order)
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        where, args = "owner = ?", [owner]
        if after:
            mark = self._read("SELECT rowid FROM conversations WHERE id = ? AND owner = ?", after, owner)
            if not mark:
                raise _not_found("Conversation", after)
            where += f" AND rowid {op} ?"
            args.append(mark[0][0])
        rows = self._read(
            f"SELECT id, created_at, metadata FROM conversations WHERE {where} ORDER BY rowid {direction} "
            "LIMIT ?",
            *args,
            limit + 1,
        )
        return Page([self._conversation(r) for r in rows[:limit]], len(rows) > limit)

    def update_conversation(self, owner: str, conv_id: str, metadata: dict[str, str]) -> dict[str, Any]:
        meta = _json(metadata)
        size = ROW_BYTES + len(meta.encode())
        with self._tx() as db:
            old = self._owned(db, owner, conv_id)
            db.execute("UPDATE conversations SET metadata = ?, size = ? WHERE id = ?", (meta, size, conv_id))
            self._charge(db, owner, size - old)
        return self.get_conversation(owner, conv_id)

    def delete_conversation(self, owner: str, conv_id: str) -> dict[str, Any]:
        with self._tx() as db:
            size = self._owned(db, owner, conv_id)
            items = db.execute(
                "SELECT COALESCE(SUM(size), 0) FROM items WHERE conversation = ?", (conv_id,)
            ).fetchone()[0]
            db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))
            self._charge(db, owner, -size - int(items))
        return {"id": conv_id, "object": "conversation.deleted", "deleted": True}

    def _owned(self, db: sqlite3.Connection, owner: str, conv_id: str) -> int:
        """The size a conversation of the owner's counts (404 when it has none of that id)."""
        return _owned_size(db, "conversations", "Conversation", owner, conv_id)

    def _append(self, db: sqlite3.Connection, owner: str, conv_id: str, items: list[dict[str, Any]]) -> None:
        total = 0
        for item in items:
            data = _json(item)
            total += len(data.encode())
            db.execute(
                "INSERT INTO items(conversation, id, data, size) VALUES(?, ?, ?, ?)",
                (conv_id, item["id"], data, len(data.encode())),
            )
        self._charge(db, owner, total)

    def add_items(self, owner: str, conv_id: str, items: list[dict[str, Any]]) -> Page:
        self.check_room(owner)
        with self._tx() as db:
            self._owned(db, owner, conv_id)
            self._append(db, owner, conv_id, items)
        return Page(items, False)

    def list_items(self, owner: str, conv_id: str, limit: int, order: str, after: str | None) -> Page:
        limit, order = _page_args(limit, order)
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        with self._lock:
            self._owned(self._db, owner, conv_id)
            where, args = "conversation = ?", [conv_id]
            if after:
                mark = self._db.execute(
                    "SELECT seq FROM items WHERE conversation = ? AND id = ?", (conv_id, after)
                ).fetchone()
                if not mark:
                    raise _not_found("Item", after)
                where += f" AND seq {op} ?"
                args.append(mark[0])
            rows = self._db.execute(
                f"SELECT data FROM items WHERE {where} ORDER BY seq {direction} LIMIT ?", (*args, limit + 1)
            ).fetchall()
        return Page([json.loads(r[0]) for r in rows[:limit]], len(rows) > limit)

    def all_items(self, owner: str, conv_id: str) -> list[dict[str, Any]]:
        """Every item of a conversation, oldest first (the context of a response in it)."""
        with self._lock:
            self._owned(self._db, owner, conv_id)
            rows = self._db.execute(
                "SELECT data FROM items WHERE conversation = ? ORDER BY seq", (conv_id,)
            ).fetchall()
        return [json.loads(r[0]) for r in rows]

    def get_item(self, owner: str, conv_id: str, item_id: str) -> dict[str, Any]:
        with self._lock:
            self._owned(self._db, owner, conv_id)
            row = self._db.execute(
                "SELECT data FROM items WHERE conversation = ? AND id = ? ORDER BY seq LIMIT 1",
                (conv_id, item_id),
            ).fetchone()
        if row is None:
            raise _not_found("Item", item_id)
        return dict(json.loads(row[0]))

    def _item_row(self, db: sqlite3.Connection, owner: str, conv_id: str, item_id: str) -> tuple[int, int]:
        """(seq, size) of an item of one of the owner's conversations (404 when either is not found)."""
        self._owned(db, owner, conv_id)
        row = db.execute(
            "SELECT seq, size FROM items WHERE conversation = ? AND id = ? ORDER BY seq LIMIT 1",
            (conv_id, item_id),
        ).fetchone()
        if row is None:
            raise _not_found("Item", item_id)
        return int(row[0]), int(row[1])

    def replace_item(self, owner: str, conv_id: str, item_id: str, item: dict[str, Any]) -> dict[str, Any]:
        """Replace an item in place (an extension of OpenAI's API: the web UI updates a message it stored)."""
        item = {**item, "id": item_id}
        data = _json(item)
        size = len(data.encode())
        with self._tx() as db:
            row = self._item_row(db, owner, conv_id, item_id)
            if size > int(row[1]) and self._used(db, owner) >= self.quota_bytes:
                raise _full(self.quota_bytes)
            db.execute("UPDATE items SET data = ?, size = ? WHERE seq = ?", (data, size, row[0]))
            self._charge(db, owner, size - int(row[1]))
        return item

    def delete_item(self, owner: str, conv_id: str, item_id: str) -> dict[str, Any]:
        with self._tx() as db:
            row = self._item_row(db, owner, conv_id, item_id)
            db.execute("DELETE FROM items WHERE seq = ?", (row[0],))
            self._charge(db, owner, -int(row[1]))
        return self.get_conversation(owner, conv_id)

    # -- responses ---------------------------------------------------------------------------------------

    def save_response(
        self,
        owner: str,
        body: dict[str, Any],
        input_items: list[dict[str, Any]],
        *,
        keep: bool,
        conversation: str | None,
    ) -> None:
        """A completed response: stored (when `keep`) with its own input items, and, when it ran in a
        conversation, its input and output items appended there; one transaction."""
        output = body.get("output", [])
        with self._tx() as db:
            if keep:
                data, inputs = _json(body), _json(input_items)
                size = len(data.encode()) + len(inputs.encode())
                db.execute(
                    "INSERT OR REPLACE INTO responses(id, owner, created_at, previous, body, input, size) "
                    "VALUES(?, ?, ?, ?, ?, ?, ?)",
                    (
                        body["id"],
                        owner,
                        body["created_at"],
                        body.get("previous_response_id"),
                        data,
                        inputs,
                        size,
                    ),
                )
                self._charge(db, owner, size)
            if conversation is not None:
                self._owned(db, owner, conversation)
                self._append(db, owner, conversation, [*input_items, *output])

    def get_response(self, owner: str, resp_id: str) -> dict[str, Any]:
        rows = self._read("SELECT body FROM responses WHERE id = ? AND owner = ?", resp_id, owner)
        if not rows:
            raise _not_found("Response", resp_id)
        return dict(json.loads(rows[0][0]))

    def delete_response(self, owner: str, resp_id: str) -> dict[str, Any]:
        with self._tx() as db:
            size = _owned_size(db, "responses", "Response", owner, resp_id)
            db.execute("DELETE FROM responses WHERE id = ?", (resp_id,))
            self._charge(db, owner, -size)
        return {"id": resp_id, "object": "response", "deleted": True}

    def input_items(self, owner: str, resp_id: str, limit: int, order: str, after: str | None) -> Page:
        limit, order = _page_args(limit, order)
        rows = self._read("SELECT input FROM responses WHERE id = ? AND owner = ?", resp_id, owner)
        if not rows:
            raise _not_found("Response", resp_id)
        items: list[dict[str, Any]] = json.loads(rows[0][0])
        if order == "desc":
            items.reverse()
        if after:
            ids = [i.get("id") for i in items]
            if after not in ids:
                raise _not_found("Item", after)
            items = items[ids.index(after) + 1 :]
        return Page(items[:limit], len(items) > limit)

    def context(self, owner: str, resp_id: str) -> list[dict[str, Any]]:
        """The items a response continued by `previous_response_id` starts from: every input and output item
        along the chain ending at `resp_id`, oldest first. A deleted link ends the chain there."""
        chain: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
        current: str | None = resp_id
        with self._lock:
            while current is not None and len(chain) < MAX_CHAIN:
                row = self._db.execute(
                    "SELECT previous, body, input FROM responses WHERE id = ? AND owner = ?", (current, owner)
                ).fetchone()
                if row is None:
                    if current == resp_id:
                        raise _not_found("Response", resp_id)
                    break
                chain.append((json.loads(row[2]), json.loads(row[1]).get("output", [])))
                current = row[0]
        out: list[dict[str, Any]] = []
        for inputs, outputs in reversed(chain):
            out += inputs
            out += outputs
        return out
