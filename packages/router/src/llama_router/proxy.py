"""Forwarding a request to the child (or remote replica) serving its model (router.md §4.2), as a plain
ASGI handler: the response is streamed back chunk by chunk, and a client that goes away closes the
connection to the child, which then stops generating."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any
from urllib.parse import parse_qs

import httpx
from llama_tools.auth import key_scope

from .cluster import conversation_key
from .keep_alive import KeepAliveError, parse_keep_alive
from .models import Instance, LoadError, ModelManager
from .replicas import Replica, pick_replica
from .streams import child_id
from .upstream import Upstream, UpstreamError, UpstreamUnreachable

__all__ = ["GET_PROXIED", "POST_PROXIED", "Proxy", "is_proxied", "send_error"]

log = logging.getLogger("llama_router")

POST_PROXIED = frozenset(
    [
        "/completion",
        "/completions",
        "/v1/completions",
        "/chat/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/control",
        "/responses",
        "/v1/responses",
        "/audio/transcriptions",
        "/v1/audio/transcriptions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/infill",
        "/embedding",
        "/embeddings",
        "/v1/embeddings",
        "/rerank",
        "/reranking",
        "/v1/rerank",
        "/v1/reranking",
        "/v1/systemone",
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/chat/completions/input_tokens",
        "/v1/chat/completions/input_tokens",
        "/responses/input_tokens",
        "/v1/responses/input_tokens",
        "/lora-adapters",
        "/props",
    ]
)
GET_PROXIED = frozenset({"/metrics", "/lora-adapters", "/slots", "/props"})
_DROP_REQUEST = frozenset(
    [
        *(
            b"accept-encoding",
            b"content-length",
            b"transfer-encoding",
            b"host",
            b"authorization",
            b"x-api-key",
        ),
        # the router's edge judged the origin (its CORS policy and guard) and drops the child's CORS
        # headers: the child, reached under its own address, would take the router's page for a foreign one
        b"origin",
        *(b"connection", b"keep-alive", b"expect", b"te", b"upgrade"),  # hop by hop: the relay's own
    ]
)
_DROP_RESPONSE = frozenset({b"server", b"transfer-encoding", b"content-length", b"keep-alive", b"connection"})
JSON = b"application/json; charset=utf-8"


def is_proxied(method: str, path: str, query: dict[str, list[str]]) -> bool:
    if method == "POST":
        return path in POST_PROXIED or path.startswith("/slots/")
    if method == "GET" and path in GET_PROXIED:
        return path != "/props" or bool(query.get("model"))
    return False


async def send_error(send: Any, code: int, message: str, kind: str, headers: list[Any] | None = None) -> None:
    body = json.dumps({"error": {"code": code, "message": message, "type": kind}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": code,
            "headers": [
                (b"content-type", JSON),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ConnectionResetError("client disconnected")
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(chunks)


def _autoload(query: dict[str, list[str]], default: bool) -> bool:
    v = (query.get("autoload") or [""])[0]
    return default if not v else v in ("true", "1")


def model_from_body(body: bytes) -> str:
    try:
        data = json.loads(body) if body else None
    except ValueError:
        return ""
    m = data.get("model") if isinstance(data, dict) else None
    return m if isinstance(m, str) else ""


def keep_alive_from_body(body: bytes) -> float | None:
    """The request's `keep_alive` in seconds (None: not given); KeepAliveError when malformed."""
    if b"keep_alive" not in body:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("keep_alive") is None:
        return None
    return parse_keep_alive(data["keep_alive"])


class Proxy:
    """The proxied routes of one router."""

    def __init__(self, manager: ModelManager, client: httpx.AsyncClient) -> None:
        self.manager = manager
        self.client = client
        self.conversations: Any = None  # set by the app: the conv_id -> model map
        self.upstream = Upstream()  # the relay's own client: the per-chunk cost is the router's overhead

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        method, _path = scope["method"], scope["path"]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        try:
            body = await read_body(receive) if method == "POST" else b""
        except ConnectionResetError:
            return
        name = model_from_body(body) if method == "POST" else ""
        if not name:
            name = (query.get("model") or [""])[0]
        if not name and b"multipart/form-data" in headers.get(b"content-type", b""):
            name = _multipart_field(body, "model")
        if not name:
            await send_error(send, 400, "model name is missing from the request", "invalid_request_error")
            return
        inst = self.manager.resolve(name)
        if inst is None:
            await send_error(send, 400, f"model '{name}' not found", "invalid_request_error")
            return
        try:
            keep_alive = keep_alive_from_body(body) if method == "POST" else None
        except KeepAliveError as e:
            await send_error(send, 400, str(e), "invalid_request_error")
            return
        conv = headers.get(b"x-conversation-id", b"").decode("utf-8", "replace")
        if conv and self.manager.config.api_keys:  # the id the map and the child know: the key's own
            conv = _scoped(self.manager.config.api_keys, headers, conv)
            scope = {**scope, "headers": _with_conversation(scope.get("headers", []), conv)}
        ticket = self.conversations.register(conv, inst.name) if conv and self.conversations else None
        disconnected = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            if inst.entry.remote:
                await self._forward(inst, scope, body, send, disconnected, method == "POST")
                return
            if inst.pool is not None:
                await self._forward_pool(inst, scope, body, send, disconnected, conversation_key(conv, body))
                return
            try:
                await self._acquire(inst, query, method == "POST", disconnected, bool(conv))
            except LoadError as e:
                extra = [(b"retry-after", b"1")] if e.code == 503 else None
                await send_error(send, e.code, e.message, e.kind, extra)
                return
            except asyncio.CancelledError:
                if disconnected.done():
                    return  # the client left while queued: the request is dropped
                raise
            try:
                if ticket is not None and not self.conversations.current(conv, ticket):
                    await send_error(
                        send,
                        400,
                        "request cancelled by a stop while the model was loading",
                        "invalid_request_error",
                    )
                    return
                await self._forward(inst, scope, body, send, disconnected, method == "POST")
            finally:
                self.manager.release(inst, keep_alive)
        finally:
            disconnected.cancel()

    async def _acquire(
        self, inst: Instance, query: dict[str, list[str]], post: bool, disconnected: Any, keep: bool
    ) -> None:
        autoload = _autoload(query, self.manager.config.models_autoload)
        if inst.status in ("loaded", "sleeping") and not inst.stopping:
            self.manager._take(inst, post)
        elif keep:  # a conversation's request survives a page reload during the load
            await self.manager.acquire(inst, autoload, post)
        else:
            wait = asyncio.ensure_future(self.manager.acquire(inst, autoload, post))
            await asyncio.wait({wait, disconnected}, return_when=asyncio.FIRST_COMPLETED)
            if not wait.done():
                wait.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await wait
                raise asyncio.CancelledError
            wait.result()
        if self.manager.fake_timing:
            await asyncio.sleep(2)

    async def _forward(
        self, inst: Instance, scope: Any, body: bytes, send: Any, disconnected: Any, post: bool
    ) -> None:
        if not inst.entry.remote:
            if inst.child is None or not inst.running:
                await send_error(send, 400, f"model name={inst.name} is not running", "invalid_request_error")
                return
            await self._relay(inst.base_url, inst.key, scope, body, send, disconnected)
            return
        while (replica := pick_replica(inst)) is not None:
            if await self._try_replica(inst, replica, scope, body, send, disconnected):
                return
        await send_error(send, 503, f"model name={inst.name} has no healthy replica", "unavailable_error")

    async def _try_replica(
        self, inst: Instance, replica: Replica, scope: Any, body: bytes, send: Any, disconnected: Any
    ) -> bool:
        """Relay to `replica`; False when nothing of a response came from it (then taken out: the caller
        tries another)."""
        replica.outstanding += 1
        try:
            await self._relay(replica.url, replica.key, scope, body, send, disconnected, replica=replica)
            return True
        except _Unreachable as e:  # out until a health check finds it again
            log.warning("replica %s of %s failed before answering (%s): taken out", replica.url, inst.name, e)
            replica.healthy = False
            return False
        finally:
            replica.outstanding -= 1

    async def _forward_pool(
        self, inst: Instance, scope: Any, body: bytes, send: Any, disconnected: Any, key: str
    ) -> None:
        """A model replicated on a Ray cluster: the least busy loaded replica (the conversation's last one
        on a tie); with none loaded, wait (a request waiting scales up from zero) until one is, or the
        load fails, or `--timeout` passes."""
        pool = inst.pool
        m = self.manager
        deadline = asyncio.get_running_loop().time() + m.config.timeout
        seq = pool.fail_seq
        while True:
            replica = pool.pick(key)
            if replica is not None:
                pool.remember(key, replica)  # now: a resumed stream of this conversation is looked up there
                if await self._try_replica(inst, replica, scope, body, send, disconnected):
                    return
                continue
            if pool.fail_seq != seq and not pool.healthy():
                await send_error(send, 500, pool.failed_message or f"model name={inst.name} failed to load",
                                 "server_error")  # fmt: skip
                return
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                await send_error(
                    send, 503, f"model name={inst.name} has no replica serving", "unavailable_error"
                )
                return
            if m.queued_waiters() + pool.waiting >= m.config.max_waiting:
                await send_error(send, 503, "too many requests waiting for a model, retry later",
                                 "unavailable_error", [(b"retry-after", b"1")])  # fmt: skip
                return
            pool.waiting += 1
            wait = asyncio.ensure_future(pool.news.wait())
            try:
                await asyncio.wait(
                    {wait, disconnected}, timeout=min(left, 1.0), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                wait.cancel()
                pool.waiting -= 1
            if disconnected.done():
                return

    async def _relay(
        self, base: str, key: str, scope: Any, body: bytes, send: Any, disconnected: Any,
        replica: Replica | None = None,
    ) -> None:  # fmt: skip
        """Relay the request to `base`. With a `replica`: raises _Unreachable when no response came (the
        caller may try another), and the relay ends when the replica is found gone (`replica.lost`): a
        stream with an error event, never a hang."""
        qs = scope.get("query_string", b"").decode("latin-1")
        url = base + scope["path"] + ("?" + qs if qs else "")
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in _DROP_REQUEST]
        if key:
            headers.append((b"authorization", b"Bearer " + key.encode()))
        state: dict[str, bool] = {}
        task = asyncio.ensure_future(
            self._stream(scope["method"], url, headers, body, send, replica is not None, state)
        )
        waits = {task, disconnected}
        lost = asyncio.ensure_future(replica.lost.wait()) if replica is not None else None
        if lost is not None:
            waits.add(lost)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if lost is not None:
                lost.cancel()
        # client or replica gone: closing our side of the connection cancels the work there
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            if disconnected.done():
                return
            if not state.get("started"):
                raise _Unreachable("the replica was lost")
            if state.get("sse"):
                await send({"type": "http.response.body", "body": _lost_event(), "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        task.result()

    async def _stream(
        self, method: str, url: str, headers: list[Any], body: bytes, send: Any, retry: bool = False,
        state: dict[str, bool] | None = None,
    ) -> None:  # fmt: skip
        state = {} if state is None else state
        try:
            resp = await self.upstream.request(method, url, headers, body)
        except UpstreamUnreachable as e:
            if retry:
                raise _Unreachable(str(e)) from None
            await send_error(send, 500, f"proxy error: {e}", "server_error")
            return
        except UpstreamError as e:
            if retry:  # it broke before any response: the request goes elsewhere
                raise _Unreachable(str(e)) from None
            await send(
                {"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"text/plain")]}
            )
            await send({"type": "http.response.body", "body": f"proxy error: {e}".encode()})
            return
        try:
            out = [(k, v) for k, v in resp.headers if k.lower() not in _DROP_RESPONSE]
            out = [(k, v) for k, v in out if not k.lower().startswith(b"access-control-")]
            sse = resp.header(b"content-type").startswith(b"text/event-stream")
            state["sse"] = sse
            await send({"type": "http.response.start", "status": resp.status, "headers": out})
            state["started"] = True
            try:
                async for chunk in resp.chunks():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except UpstreamError as e:
                log.warning("the child's response broke off: %s", e)
                if sse:
                    await send({"type": "http.response.body", "body": _lost_event(), "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await resp.aclose()


def _scoped(keys: tuple[str, ...], headers: dict[bytes, bytes], conv: str) -> str:
    auth = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers.items()
            if k in (b"authorization", b"x-api-key")}  # fmt: skip
    return child_id(key_scope(keys, auth), conv)


def _with_conversation(raw: list[Any], conv: str) -> list[Any]:
    """The request headers with `X-Conversation-Id` set to the scoped id."""
    out = [(k, v) for k, v in raw if k.lower() != b"x-conversation-id"]
    out.append((b"x-conversation-id", conv.encode()))
    return out


def _lost_event() -> bytes:
    err = {"error": {"code": 500, "message": "the model's process ended", "type": "server_error"}}
    return b"data: " + json.dumps(err).encode() + b"\n\n"


class _Unreachable(Exception):
    """The upstream refused the connection: the request was not sent."""


async def _wait_disconnect(receive: Any) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


def _multipart_field(body: bytes, field: str) -> str:
    """A text field of a multipart/form-data body (the `model` of an audio transcription)."""
    marker = f'name="{field}"'.encode()
    i = body.find(marker)
    if i < 0:
        return ""
    start = body.find(b"\r\n\r\n", i)
    end = body.find(b"\r\n", start + 4)
    return body[start + 4 : end].decode("utf-8", "replace").strip() if start >= 0 and end > 0 else ""
