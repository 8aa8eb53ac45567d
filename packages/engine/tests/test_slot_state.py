"""Slot state files (save, restore, erase) and the engine API around slots: prompt-only requests,
the queue bound, cancellable embeddings, per-token timings and slot snapshots. Tiny random models."""

from __future__ import annotations

import json
import os
import re
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from tiny_models import write_tiny_model

from llama_engine import (
    EmbeddingRequest,
    Engine,
    EngineConfig,
    GenerationRequest,
    QueueFullError,
    RequestCancelledError,
    SamplingParams,
    SlotState,
    StateFileError,
    StopReason,
)
from llama_engine.requests import FinalEvent, TokenEvent
from llama_engine.state_file import MAGIC, PoolState, SeqState, read_state, state_size_bound, write_state

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
PROMPT = [256, *range(60, 90)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny-state")
    return {
        "llama": write_tiny_model(d / "llama.gguf", "llama", seed=7),
        "llama_other": write_tiny_model(d / "llama-other.gguf", "llama", seed=8),
        "gemma3": write_tiny_model(d / "gemma3.gguf", "gemma3", seed=3),
        "qwen2": write_tiny_model(d / "qwen2.gguf", "qwen2", seed=5),
    }


def _engine(path: Path, **kw) -> Engine:
    cfg = EngineConfig(**{"n_ctx": 256, "n_parallel": 2, "n_batch": 64, "warmup": False, **kw})
    engine = Engine(path, cfg).start()
    engine.ready.wait()
    return engine


@pytest.fixture(scope="module")
def llama(models: dict[str, Path]):
    engine = _engine(models["llama"])
    yield engine
    engine.shutdown()


def _run(engine: Engine, req: GenerationRequest) -> tuple[list[TokenEvent], FinalEvent]:
    events = list(engine.submit(req))
    final = events[-1]
    assert isinstance(final, FinalEvent)
    return [e for e in events if isinstance(e, TokenEvent)], final


def _roundtrip(engine: Engine, path: Path, prompt: list[int]) -> None:
    req = GenerationRequest(prompt=prompt, max_tokens=8, sampling=GREEDY, slot=0)
    before, _ = _run(engine, req)
    saved = engine.save_slot(0, path)
    assert saved.n_tokens == len(prompt) + 7  # the last sampled token never enters the cache
    assert saved.n_bytes == path.stat().st_size and saved.ms >= 0
    assert engine.erase_slot(0) == saved.n_tokens
    assert engine.slots()[0].n_cached == 0
    restored = engine.restore_slot(0, path)
    assert (restored.n_tokens, restored.n_bytes) == (saved.n_tokens, saved.n_bytes)
    after, final = _run(engine, req)
    assert final.usage.cached_tokens == len(prompt) - 1  # the restored cells served the prompt
    assert [e.token for e in after] == [e.token for e in before]


def test_save_erase_restore_reuses_the_cache(llama: Engine, tmp_path: Path) -> None:
    _roundtrip(llama, tmp_path / "a.bin", PROMPT)
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary file was renamed


def test_sliding_window_layers_roundtrip(models: dict[str, Path], tmp_path: Path) -> None:
    engine = _engine(models["gemma3"])
    try:
        assert len(engine.kv.pools) == 2  # full and windowed layers
        _roundtrip(engine, tmp_path / "g.bin", PROMPT)
        state, _ = read_state(
            tmp_path / "g.bin", engine.fingerprint, [(p.layers, p.window) for p in engine.kv.pools]
        )
        assert [p.window for p in state.pools] == [None, 4]
    finally:
        engine.shutdown()


def test_restore_into_a_smaller_window_pool(models: dict[str, Path], tmp_path: Path) -> None:
    """The windowed pool of the reader may be smaller than the writer's: only the last window is loaded,
    enough to continue the conversation (a shorter reuse recomputes, as llama.cpp's SWA cache)."""
    big = _engine(models["gemma3"], n_parallel=4)
    small = _engine(models["gemma3"], n_parallel=1, n_batch=16)
    try:
        _run(big, GenerationRequest(prompt=PROMPT, max_tokens=6, sampling=GREEDY, slot=0))
        saved = big.save_slot(0, tmp_path / "g.bin")
        assert small.kv.pools[1].n_cells < saved.n_tokens
        small.restore_slot(0, tmp_path / "g.bin")
        assert len(small.kv.pools[1].seq_cells(0)) == 4
        turn = [*big.scheduler.slots[0].tokens, 70, 71, 72]
        ref, _ = _run(big, GenerationRequest(prompt=turn, max_tokens=4, sampling=GREEDY, cache_prompt=False))
        after, final = _run(small, GenerationRequest(prompt=turn, max_tokens=4, sampling=GREEDY, slot=0))
        assert final.usage.cached_tokens == saved.n_tokens
        assert [e.token for e in after] == [e.token for e in ref]
    finally:
        big.shutdown()
        small.shutdown()


def test_restore_refuses_another_model_and_leaves_the_slot(models: dict[str, Path], tmp_path: Path) -> None:
    a, b = _engine(models["llama"]), _engine(models["llama_other"])
    try:
        _run(a, GenerationRequest(prompt=PROMPT, max_tokens=2, sampling=GREEDY, slot=0))
        a.save_slot(0, tmp_path / "a.bin")
        _run(b, GenerationRequest(prompt=PROMPT[:10], max_tokens=2, sampling=GREEDY, slot=1))
        held = list(b.scheduler.slots[1].tokens)
        with pytest.raises(StateFileError, match=r"another model.*weights_sha256"):
            b.restore_slot(1, tmp_path / "a.bin")
        assert b.scheduler.slots[1].tokens == held
    finally:
        a.shutdown()
        b.shutdown()
    q = _engine(models["qwen2"])
    try:
        with pytest.raises(StateFileError, match=r"another model.*architecture"):
            q.restore_slot(0, tmp_path / "a.bin")
    finally:
        q.shutdown()


def test_corrupt_and_missing_files(llama: Engine, tmp_path: Path) -> None:
    _run(llama, GenerationRequest(prompt=PROMPT, max_tokens=2, sampling=GREEDY, slot=1))
    good = tmp_path / "good.bin"
    llama.save_slot(1, good)
    held = list(llama.scheduler.slots[1].tokens)
    data = good.read_bytes()
    cases = {
        "flipped.bin": (data[:-100] + bytes([data[-100] ^ 1]) + data[-99:], "checksum"),
        "short.bin": (data[: len(data) // 2], "checksum|length|corrupt"),
        "magic.bin": (b"GGUF" + data[4:], "magic"),
        "version.bin": (MAGIC + struct.pack("<I", 99) + data[12:], "version"),
        "tiny.bin": (b"x", "too short"),
    }
    for name, (content, reason) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(StateFileError, match=reason):
            llama.restore_slot(1, tmp_path / name)
        assert llama.scheduler.slots[1].tokens == held
    with pytest.raises(StateFileError, match="not found"):
        llama.restore_slot(1, tmp_path / "missing.bin")
    with pytest.raises(ValueError, match="no slot 5"):
        llama.erase_slot(5)


def _with_header(data: bytes, edit) -> bytes:
    """`data`, a valid state file, with its JSON header replaced by ``edit(header_text)`` and a valid CRC."""
    magic, version, hlen = struct.unpack_from("<8sII", data)
    body = data[16:-4]
    header = edit(body[:hlen].decode())
    new_body = header.encode() + body[hlen:]
    return (
        struct.pack("<8sII", magic, version, len(header.encode()))
        + new_body
        + struct.pack("<I", zlib.crc32(new_body))
    )


def test_hostile_headers_with_a_valid_checksum(llama: Engine, tmp_path: Path) -> None:
    """A header that parses but lies (an infinite count, a fingerprint of the wrong type, nesting deeper than
    the parser's stack) is a StateFileError naming a bad header, and the slot keeps what it had."""
    _run(llama, GenerationRequest(prompt=PROMPT, max_tokens=2, sampling=GREEDY, slot=1))
    good = tmp_path / "good.bin"
    llama.save_slot(1, good)
    held = list(llama.scheduler.slots[1].tokens)
    data = good.read_bytes()
    edits = {
        "inf-tokens.bin": lambda h: re.sub(r'"n_tokens": *\d+', '"n_tokens": 1e400', h),
        "inf-layer.bin": lambda h: re.sub(r'"layers": *\[\d+', '"layers": [1e400', h),
        "list-fingerprint.bin": lambda h: json.dumps({**json.loads(h), "fingerprint": [1, 2]}),
        "deep.bin": lambda h: h[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
    }
    for name, edit in edits.items():
        content = _with_header(data, edit)
        assert content != data
        (tmp_path / name).write_bytes(content)
        with pytest.raises(StateFileError, match="bad header"):
            llama.restore_slot(1, tmp_path / name)
        assert llama.scheduler.slots[1].tokens == held


def test_restore_larger_than_the_slot_context(models: dict[str, Path], tmp_path: Path) -> None:
    big = _engine(models["llama"], n_ctx=256, n_parallel=1)
    small = _engine(models["llama"], n_ctx=32, n_parallel=1)
    try:
        _run(big, GenerationRequest(prompt=PROMPT, max_tokens=4, sampling=GREEDY, slot=0))
        big.save_slot(0, tmp_path / "big.bin")
        with pytest.raises(StateFileError, match="more than the context"):
            small.restore_slot(0, tmp_path / "big.bin")
    finally:
        big.shutdown()
        small.shutdown()


def _layout(engine: Engine) -> list[tuple[list[int], int | None]]:
    return [(p.layers, p.window) for p in engine.kv.pools]


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_size_bound_is_the_largest_file_a_slot_holds(
    models: dict[str, Path], tmp_path: Path, name: str
) -> None:
    engine = _engine(models[name], n_ctx=64, n_parallel=1)
    try:
        n, fp, layout = engine.n_ctx_slot, engine.fingerprint, _layout(engine)
        kv_dim = fp["kv_dim"]
        full = SeqState(
            np.zeros(n, np.int32),
            [
                PoolState(layers, window, np.arange(n, dtype=np.int32),
                          np.zeros((len(layers), n, kv_dim)), np.zeros((len(layers), n, kv_dim)))
                for layers, window in layout
            ],
        )  # fmt: skip
        written = write_state(tmp_path / "full.bin", fp, full)
        assert written == (tmp_path / "full.bin").stat().st_size == state_size_bound(fp, layout, n)
        assert state_size_bound(fp, layout, n - 1) < written
        state, _ = read_state(tmp_path / "full.bin", fp, layout, written)  # exactly at the bound: read
        assert state.n_tokens == n
    finally:
        engine.shutdown()


def test_restore_reads_only_regular_files_in_place(llama: Engine, tmp_path: Path) -> None:
    """A symbolic link (to a slot file, a FIFO or a device) is refused, a FIFO does not block, and a file
    larger than the bound is refused before a byte of it is read; the slot keeps what it held."""
    slots, outside = tmp_path / "slots", tmp_path / "outside"
    slots.mkdir()
    outside.mkdir()
    _run(llama, GenerationRequest(prompt=PROMPT, max_tokens=2, sampling=GREEDY, slot=1))
    llama.save_slot(1, outside / "good.bin")
    held = list(llama.scheduler.slots[1].tokens)
    os.mkfifo(outside / "fifo")
    os.mkfifo(slots / "fifo.bin")
    (slots / "link.bin").symlink_to(outside / "good.bin")
    (slots / "fifo-link.bin").symlink_to(outside / "fifo")
    (slots / "zero.bin").symlink_to("/dev/zero")
    with open(slots / "huge.bin", "wb") as f:
        f.truncate(64 << 30)  # sparse: reading it would take minutes
    cases = {
        "link.bin": "symbolic link",
        "fifo-link.bin": "symbolic link",
        "zero.bin": "symbolic link",
        "fifo.bin": "not a regular file",
        "huge.bin": "more than the context",
    }
    for name, reason in cases.items():
        t0 = time.monotonic()
        with pytest.raises(StateFileError, match=reason):
            llama.restore_slot(1, slots / name)
        assert time.monotonic() - t0 < 5, name
        assert llama.scheduler.slots[1].tokens == held
    with pytest.raises(StateFileError, match="symbolic link"):
        read_state(slots / "zero.bin", llama.fingerprint, _layout(llama))  # no bound given: still refused


def test_save_replaces_a_planted_link(llama: Engine, tmp_path: Path) -> None:
    target = tmp_path / "target.txt"
    target.write_text("keep me")
    (tmp_path / "slots").mkdir()
    dest = tmp_path / "slots" / "a.bin"
    dest.symlink_to(target)
    _run(llama, GenerationRequest(prompt=PROMPT[:8], max_tokens=2, sampling=GREEDY, slot=0))
    saved = llama.save_slot(0, dest)
    assert target.read_text() == "keep me"
    assert not dest.is_symlink() and dest.stat().st_size == saved.n_bytes
    assert oct(dest.stat().st_mode & 0o777) == "0o600"
    assert llama.restore_slot(0, dest).n_tokens == saved.n_tokens


def test_prompt_only_request(llama: Engine) -> None:
    prompt = [256, *range(5, 25)]
    tokens, final = _run(llama, GenerationRequest(prompt=prompt, max_tokens=0, sampling=GREEDY, slot=0))
    assert tokens == [] and final.reason == StopReason.LENGTH
    assert final.usage.completion_tokens == 0 and final.timings.predicted_n == 0
    assert final.timings.prompt_n + final.timings.cache_n == len(prompt)
    assert llama.slots()[0].n_cached == len(prompt)  # every prompt token was evaluated
    _, again = _run(llama, GenerationRequest(prompt=prompt, max_tokens=1, sampling=GREEDY, slot=0))
    assert again.usage.cached_tokens == len(prompt) - 1
    with pytest.raises(ValueError, match="max_tokens"):
        llama.submit(GenerationRequest(prompt=prompt, max_tokens=-2))


def test_timings_per_token(llama: Engine) -> None:
    req = GenerationRequest(prompt=PROMPT[:8], max_tokens=4, sampling=GREEDY, timings_per_token=True)
    tokens, final = _run(llama, req)
    assert [t.timings.predicted_n for t in tokens if t.timings] == [1, 2, 3, 4]
    ms = [t.timings.predicted_ms for t in tokens if t.timings]
    assert ms == sorted(ms) and ms[-1] <= final.timings.predicted_ms
    plain, _ = _run(llama, GenerationRequest(prompt=PROMPT[:8], max_tokens=2, sampling=GREEDY))
    assert all(t.timings is None for t in plain)


def test_slot_snapshot(llama: Engine) -> None:
    _run(llama, GenerationRequest(prompt=PROMPT[:6], max_tokens=3, sampling=GREEDY, slot=1))
    info = llama.slots()[1]
    assert (info.id, info.state, info.is_processing, info.n_ctx) == (1, SlotState.IDLE, False, 256)
    assert (info.n_prompt, info.n_generated, info.n_cached) == (6, 3, 6 + 2)


def test_queue_bound_counts_the_inbox(models: dict[str, Path]) -> None:
    """Slots plus max_queue requests may be in flight; the rest are refused at submit, before the loop
    has even seen the earlier ones."""
    engine = Engine(models["llama"], EngineConfig(n_ctx=64, n_parallel=1, max_queue=2, warmup=False))
    req = GenerationRequest(prompt=[256, 1], max_tokens=1)
    handles = [engine.submit(req) for _ in range(3)]
    assert engine.n_waiting == 3
    with pytest.raises(QueueFullError):
        engine.submit(req)
    engine.start()
    try:
        for h in handles:
            assert list(h)[-1].reason == StopReason.LENGTH  # type: ignore[union-attr]
        assert engine.n_waiting == 0
        engine.submit(req).cancel()  # room again
    finally:
        engine.shutdown()


def test_embedding_can_be_cancelled(models: dict[str, Path]) -> None:
    engine = Engine(models["llama"], EngineConfig(n_ctx=64, n_parallel=1, warmup=False))
    handle = engine.submit_embedding(EmbeddingRequest(prompt=[256, 1, 2, 3]))
    handle.cancel()  # before the loop runs it
    engine.start()
    try:
        with pytest.raises(RequestCancelledError):
            handle.result()
        v = engine.embed(EmbeddingRequest(prompt=[256, 1, 2, 3]))
        assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5
    finally:
        engine.shutdown()
