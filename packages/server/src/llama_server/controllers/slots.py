"""GET /slots and POST /slots/{id_slot}?action=save|restore|erase."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath, FromQuery, JSONBody
from llama_tools.auth import key_scope

from llama_engine import StateFileError

from ..errors import ApiError
from ..schemas import SlotFileBody
from ..state import SlotRecord
from ._common import SharedState, json_response

__all__ = ["SlotsController", "valid_filename"]

_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f/\\:*?\"<>|]")


def valid_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename, simplified: a plain file name inside the save directory."""
    try:
        size = len(name.encode("utf-8"))  # lone surrogates (from JSON escapes) are not a file name
    except UnicodeEncodeError:
        return False
    return (
        0 < size <= 255
        and name not in (".", "..")
        and ".." not in name
        and not _BAD_CHARS.search(name)
        and name == name.strip()
        and not name.endswith(".")
    )


class SlotsController(Controller):
    @get("/slots")
    async def slots(
        self,
        request: Request,
        server: SharedState,
        fail_on_no_slot: FromQuery[str | None] = None,
        queue: FromQuery[str | None] = None,
    ) -> Response:
        st = server
        scope = key_scope(st.config.api_keys, request.headers)  # another key's tasks show as blank
        if not st.config.endpoint_slots:
            raise ApiError(
                "This server does not support slots endpoint. Start it with `--slots`", "not_supported_error"
            )
        engine = st.require_engine()
        out: list[dict[str, Any]] = []
        any_idle = False
        speculative = engine.speculator is not None
        for slot in engine.slots():
            busy = slot.is_processing
            any_idle |= not busy
            entry: dict[str, Any] = {"id": slot.id, "n_ctx": slot.n_ctx, "speculative": speculative}
            entry["is_processing"] = busy
            rec = st.slots.get(slot.id)
            mine = slot.scope == scope
            if st.config.scheduling_policy == "priority":
                entry["priority"] = slot.priority if busy and mine else 0
            if rec is not None and rec.scope != scope:
                rec = SlotRecord()
            if rec is not None:
                entry.update(
                    id_task=rec.id_task,
                    n_prompt_tokens=rec.n_prompt_tokens,
                    n_prompt_tokens_processed=rec.n_prompt_tokens_processed,
                    n_prompt_tokens_cache=rec.n_prompt_tokens_cache,
                    next_token=[
                        {
                            "has_next_token": busy,
                            "has_new_line": False,
                            "n_remain": -1,
                            "n_decoded": slot.n_generated if busy and mine else 0,
                        }
                    ],
                )
            out.append(entry)
        if fail_on_no_slot and not any_idle:
            raise ApiError("no slot available", "unavailable_error")
        if queue not in (None, "", "0", "false"):  # ours: the waiting requests too, in admission order
            waiting = [
                {
                    "position": i,
                    "priority": q.priority if q.scope == scope else 0,
                    "n_prompt_tokens": q.n_prompt if q.scope == scope else 0,
                    "waited_ms": round(q.waited_s * 1e3, 1),
                    "preempted": q.preempted,
                    "mine": q.scope == scope,
                }
                for i, q in enumerate(engine.queue())
            ]
            return json_response({"slots": out, "queue": waiting, "n_waiting": engine.n_waiting})
        return json_response(out)

    @post("/slots/{id_slot:str}", status_code=200)
    async def action(
        self,
        request: Request,
        server: SharedState,
        id_slot: FromPath[str],
        action: FromQuery[str] = "",
        data: JSONBody[SlotFileBody | None] = None,
    ) -> Response:
        """Save, restore or erase a slot's KV cache (each waits until the slot is idle); erase needs no body."""
        st = server
        if not st.config.slot_save_path:
            raise ApiError(
                "This server does not support slots action. Start it with `--slot-save-path`",
                "not_supported_error",
            )
        try:
            sid = int(id_slot)
        except ValueError:
            raise ApiError("Invalid slot ID") from None
        if sid < 0:
            raise ApiError("Invalid slot ID")
        if action not in ("save", "restore", "erase"):
            raise ApiError("Invalid action")
        filename = ""
        if action in ("save", "restore"):
            if data is None or not data.filename or not valid_filename(data.filename):
                raise ApiError("Invalid filename")
            filename = data.filename
        engine = st.require_engine()
        sid %= engine.config.n_parallel  # positive ids wrap, as the reference's
        scope = key_scope(st.config.api_keys, request.headers)  # a key saves and erases only its own cache
        if action == "erase":
            n_erased = await asyncio.to_thread(engine.erase_slot, sid, scope)
            return json_response({"id_slot": sid, "n_erased": n_erased})
        path = Path(st.config.slot_save_path) / filename
        if action == "save":
            try:
                res = await asyncio.to_thread(engine.save_slot, sid, path, scope)
            except OSError as e:
                raise ApiError(f"Unable to save slot: {e.strerror or e}", "server_error") from None
            return json_response(
                {"id_slot": sid, "filename": filename, "n_saved": res.n_tokens, "n_written": res.n_bytes}
                | {"timings": {"save_ms": res.ms}}
            )
        try:
            res = await asyncio.to_thread(engine.restore_slot, sid, path, scope)  # restored: the caller's
        except StateFileError as e:
            raise ApiError(f"Unable to restore slot: {e}") from None
        st.slots.pop(sid, None)  # the slot's last task is not what it holds any more
        return json_response(
            {"id_slot": sid, "filename": filename, "n_restored": res.n_tokens, "n_read": res.n_bytes}
            | {"timings": {"restore_ms": res.ms}}
        )
