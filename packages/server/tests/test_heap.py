"""The server's heap around a model load: no cyclic collection while loading, the loaded objects frozen
out of the collector's view afterwards (a full collection would otherwise walk them, holding the GIL, at
random moments while streams run), collection always back on, and unfrozen before a model is released."""

from __future__ import annotations

import gc

from llama_server import ServerConfig
from llama_server.state import ServerState, release_heap, settle_heap


def test_settle_then_release():
    gc.disable()
    try:
        settle_heap()
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        release_heap()
        gc.enable()
    assert gc.get_freeze_count() == 0


def test_a_failed_load_turns_collection_back_on(tmp_path):
    state = ServerState(ServerConfig(model=str(tmp_path / "missing.gguf")))
    state.exit_on_load_error = False
    state._load()
    assert state.load_error and state.engine is None
    assert gc.isenabled() and gc.get_freeze_count() == 0
