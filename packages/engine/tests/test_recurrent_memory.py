"""The memory of a model with recurrent layers (a tiny lfm2): the recurrent pool's per-sequence state
operations, the short convolution against its numpy reference, and chat turns resumed from context
checkpoints (the state cannot be cut back to a shared prefix) with the text of a full recompute."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from drive import drive_alone
from tiny_models import N_EMBD, write_tiny_model

from gguf_io import open as open_gguf
from llama_engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from llama_engine.arch import load_model
from llama_engine.batch import Batch
from llama_engine.checkpoints import CheckpointConfig
from llama_engine.layers import ref
from llama_engine.layers.short_conv import short_conv
from llama_engine.memory import RecurrentPool
from llama_engine.requests import FinalEvent, TokenEvent

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("lfm2-mem") / "lfm2.gguf", "lfm2", seed=5)


def test_short_conv_equals_its_reference() -> None:
    rng = np.random.default_rng(0)
    n, d, d_conv, n_seq = 7, 12, 3, 3
    bcx = rng.standard_normal((n, 3 * d)).astype(np.float32)
    w = rng.standard_normal((d, d_conv + 1)).astype(np.float32)
    rows = np.array([2, 2, 0, 0, 0, 1, 2], np.int32)  # runs of three sequences, one of them twice
    state = rng.standard_normal((n_seq, d * d_conv)).astype(np.float32)
    got, want = np.zeros((n, d), np.float32), np.zeros((n, d), np.float32)
    s_got, s_want = state.copy(), state.copy()
    short_conv(got, bcx, s_got, w, rows, n, d, d_conv)
    ref.short_conv(want, bcx, s_want, w, rows, n, d, d_conv)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(s_got, s_want)


def test_recurrent_state_is_copied_whole_never_cut() -> None:
    pool = RecurrentPool(3, [0, 2], r_dim=4, s_dim=2)
    pool.check(np.array([0, 0, 0], np.int32), np.array([0, 1, 2], np.int32))
    pool.place(np.array([0, 0, 0], np.int32), np.array([0, 1, 2], np.int32))
    pool.k[0][0], pool.v[2][0] = 1.5, -2.0
    assert pool.covers(0, 3) and not pool.covers(0, 2) and pool.covers(0, 0)
    pool.seq_cp(0, 1, 0, 2)  # a prefix of a state is no state
    assert pool.seq_pos_max(1) == -1
    pool.seq_cp(0, 1, 0, 3)
    assert pool.seq_pos_max(1) == 2 and (pool.k[0][1] == 1.5).all() and (pool.v[2][1] == -2.0).all()
    pool.seq_rm(1, 3)  # past the state: kept
    assert pool.covers(1, 3)
    pool.seq_rm(1, 2)  # a position it absorbed: forgotten, zeroed
    assert pool.seq_pos_max(1) == -1 and not pool.k[0][1].any()
    part = pool.seq_export(0)
    assert [a.shape for a in part] == [(1,), (2, 1, 4), (2, 1, 2)]
    pool.seq_import(2, *part)
    assert pool.covers(2, 3) and (pool.k[0][2] == 1.5).all()
    with pytest.raises(ValueError, match="continues at position 5"):
        pool.check(np.array([2], np.int32), np.array([5], np.int32))
    pool.place(np.array([2], np.int32), np.array([0], np.int32))  # position 0 starts afresh
    assert not pool.k[0][2].any()


def test_a_batch_that_skips_positions_changes_nothing(path: Path) -> None:
    model = load_model(open_gguf(path))
    kv = model.make_kv_cache(64, n_seq_max=2)
    assert kv.recurrent is not None and not kv.can_shift
    model.forward(Batch.single([256, 40, 41]), kv)
    with pytest.raises(ValueError, match="recurrent state is at 2"):
        model.forward(Batch.single([42], 0, 4), kv)
    assert kv.seq_pos_max(0) == 2 and len(kv.pools[0].seq_cells(0)) == 3
    assert kv.recurrent.k[0].shape == (2, N_EMBD * 2)  # l_cache 3: the two inputs before a token


def _engine(path: Path, n_ckpt: int) -> Engine:
    cfg = EngineConfig(
        n_ctx=512, n_parallel=1, n_batch=64, warmup=False, checkpoints=CheckpointConfig(n_max=n_ckpt)
    )
    engine = Engine(path, cfg).start()
    engine.wait_ready()
    return engine


def _run(engine: Engine, prompt: list[int], n: int = 8) -> tuple[list[int], FinalEvent]:
    events = list(engine.submit(GenerationRequest(prompt=prompt, max_tokens=n, sampling=GREEDY)))
    final = events[-1]
    assert isinstance(final, FinalEvent) and not final.error
    return [e.token for e in events if isinstance(e, TokenEvent)], final


def test_chat_turns_resume_from_checkpoints(path: Path) -> None:
    """Four turns, each prompt the previous one, most of its answer (the template renders the answer's
    end anew, so the slot's state holds tokens the next prompt does not) and a new user message: with
    checkpoints a turn processes the tokens after the previous prompt's last checkpoint (4 before its
    end), without them the whole prompt; the text is the same. An edit of an earlier turn resumes from
    the newest checkpoint before the edit."""
    on, off = _engine(path, 32), _engine(path, 0)
    try:
        prompt = [256, *range(40, 70)]
        starts = []
        for turn in range(4):
            got_on, fin_on = _run(on, prompt)
            got_off, fin_off = _run(off, prompt)
            assert got_on == got_off
            assert fin_off.timings.prompt_n == len(prompt)  # the state cannot be cut back: all again
            if turn:
                assert fin_on.timings.prompt_n == len(prompt) - (starts[-1] - 4)
                assert fin_on.timings.prompt_n < 30
            starts.append(len(prompt))
            user = list(range(100 + 10 * turn, 108 + 10 * turn))
            prompt = [*prompt, *got_on[:5], 10, *user]
        marks = [c.n_tokens for c in on.scheduler.checkpoints.of(0)]
        assert [n - 4 for n in starts] == [m for m in marks if m + 4 in starts]
        edited = list(prompt)
        edited[starts[1] + 2] = 200  # inside the second answer
        got_on, fin_on = _run(on, edited)
        got_off, _ = _run(off, edited)
        assert got_on == got_off
        assert fin_on.timings.prompt_n == len(edited) - (starts[1] - 4)
    finally:
        on.shutdown()
        off.shutdown()


def test_a_prompt_comes_back_from_ram_with_its_state_and_checkpoints(path: Path) -> None:
    """--cache-ram saves the slot's conv state and its checkpoints: the evicted prompt, asked again,
    resumes from the checkpoint 4 tokens before its end (its state holds the answer too) with the text
    of its first run."""
    a, b = [256, *range(40, 80)], [256, *range(120, 160)]
    cfg = EngineConfig(n_ctx=256, n_parallel=1, n_batch=32, warmup=False, cache_ram_mib=64)
    engine = Engine(path, cfg)

    def drive(prompt: list[int]) -> tuple[list[int], int]:
        return drive_alone(engine, GenerationRequest(prompt=prompt, max_tokens=3, sampling=GREEDY))

    first, _ = drive(a)
    drive(b)  # b takes the only slot: a's state is saved first
    out, cached = drive(a)
    assert cached == len(a) - 4 and out == first


def test_slot_file_keeps_the_state(path: Path, tmp_path: Path) -> None:
    """A slot saved, erased and restored continues from its conv state: a prompt extending the slot's
    tokens reuses all of them and gives the text of a full recompute."""
    engine = _engine(path, 0)
    try:
        _run(engine, [256, *range(40, 60)])
        cached = list(engine.scheduler.slots[0].tokens)
        saved = engine.save_slot(0, tmp_path / "s.bin")
        assert saved.n_tokens == len(cached) and engine.erase_slot(0) == len(cached)
        assert engine.kv.seq_pos_max(0) == -1
        engine.restore_slot(0, tmp_path / "s.bin")
        longer = [*cached, 70, 71, 72]
        got, final = _run(engine, longer)
        assert final.usage.cached_tokens == len(cached)
        events = engine.submit(
            GenerationRequest(prompt=longer, max_tokens=8, sampling=GREEDY, cache_prompt=False)
        )
        assert got == [e.token for e in events if isinstance(e, TokenEvent)]
    finally:
        engine.shutdown()
