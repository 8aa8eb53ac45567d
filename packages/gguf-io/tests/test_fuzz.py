"""Hypothesis mutates headers derived from the real models; only GGUFError may ever escape.

The seeds are the real models' metadata and tensor tables with the vocabulary arrays cut to 300 entries
and small tensors only, so that each example is a few kilobytes and thousands run in seconds. Mutations:
byte flips, 8-byte windows overwritten with boundary values (0, 2^31, 2^32, 2^63, 2^64-1, the file size),
truncation, and inserted or deleted spans.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hostile import touch_everything

import gguf_io

FUZZ_EXAMPLES = int(os.environ.get("GGUF_IO_FUZZ_EXAMPLES", "400"))
_VOCAB_KEYS = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
)


def _seed(src: str, out: Path) -> bytes:
    with gguf_io.open(src) as f, gguf_io.GGUFWriter(out) as w:
        for field in f.fields.values():
            if field.name in _VOCAB_KEYS:
                w.add_metadata(field.name, field.value[:300], field.value_type, field.array_type)
            elif field.name in ("tokenizer.chat_template", "general.name"):
                w.add_metadata(field.name, str(field.value)[:200], field.value_type)
            else:
                w.add_field(field)
        small = [t for t in f.tensors.values() if t.nbytes <= 4096][:12]
        for t in small:
            w.add_tensor(t.name, t.shape, t.ggml_type, f.tensor_bytes(t.name))
    return out.read_bytes()


@pytest.fixture(scope="module")
def seeds(smollm2_path: str, gemma3_path: str, tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    d = tmp_path_factory.mktemp("seeds")
    result = [_seed(smollm2_path, d / "smollm2.gguf"), _seed(gemma3_path, d / "gemma3.gguf")]
    for data, name in zip(result, ("smollm2", "gemma3"), strict=True):
        (d / f"{name}.check.gguf").write_bytes(data)
        touch_everything(d / f"{name}.check.gguf")  # each seed is itself valid
    return result


_BOUNDARY = [0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


@st.composite
def mutations(draw: st.DrawFn, seed_count: int) -> tuple[int, list[tuple]]:
    which = draw(st.integers(0, seed_count - 1))
    ops = draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("flip"), st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
                st.tuples(st.just("u64"), st.floats(0, 1, exclude_max=True), st.sampled_from(_BOUNDARY)),
                st.tuples(st.just("u32"), st.floats(0, 1, exclude_max=True), st.sampled_from(_BOUNDARY[:5])),
                st.tuples(st.just("cut"), st.floats(0, 1, exclude_max=True), st.just(0)),
                st.tuples(
                    st.just("insert"), st.floats(0, 1, exclude_max=True), st.binary(min_size=1, max_size=16)
                ),
                st.tuples(st.just("delete"), st.floats(0, 1, exclude_max=True), st.integers(1, 64)),
            ),
            min_size=1,
            max_size=4,
        )
    )
    return which, ops


def _apply(data: bytes, ops: list[tuple]) -> bytes:
    buf = bytearray(data)
    for op, where, arg in ops:
        # Most structure sits in the header: aim four of five mutations there.
        at = int(where * min(len(buf), 6000)) if where < 0.8 else int(where * len(buf))
        at = min(at, max(len(buf) - 1, 0))
        if op == "flip" and buf:
            buf[at] ^= arg
        elif op == "u64":
            buf[at : at + 8] = struct.pack("<Q", arg)
        elif op == "u32":
            buf[at : at + 4] = struct.pack("<I", arg)
        elif op == "cut":
            del buf[at:]
        elif op == "insert":
            buf[at:at] = arg
        elif op == "delete":
            del buf[at : at + arg]
    return bytes(buf)


def test_mutated_real_headers_raise_only_gguf_error(seeds: list[bytes], tmp_path: Path) -> None:
    outcomes = {"rejected": 0, "accepted": 0}
    path = tmp_path / "mutant.gguf"

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(mutations(len(seeds)))
    def run(case: tuple[int, list[tuple]]) -> None:
        which, ops = case
        path.write_bytes(_apply(seeds[which], ops))
        start = time.perf_counter()
        try:
            touch_everything(path)
            outcomes["accepted"] += 1
        except gguf_io.GGUFError:
            outcomes["rejected"] += 1
        assert time.perf_counter() - start < 1.0

    run()
    print(f"\nfuzz: {sum(outcomes.values())} mutated files, {outcomes}")
    assert outcomes["rejected"] > 0
