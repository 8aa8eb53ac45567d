"""The host-RAM prompt cache through llama-server (`--cache-ram`, `--cache-idle-slots`), as llama.cpp's
own cases: an idle slot saved and cleared when another slot starts a task comes back from RAM."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import start_server, stop_server

LONG_PROMPT = (
    "Once upon a time in a land far away, there lived a brave knight "
    "who traveled across mountains and rivers to find the legendary "
    "golden sword hidden deep within the enchanted forest of whispers. "
    "He met many creatures along the way including dragons and fairies "
    "and wizards who helped him on his noble quest to save the kingdom."
)
ARGS = ("-np", "2", "-kvu", "-n", "4", "--temp", "0", "--cache-ram", "100", "--verbose", "--no-warmup")


class _Log:
    def __init__(self, path: Path) -> None:
        self.path, self.pos = path, 0

    def drain(self) -> str:
        text = self.path.read_text(errors="replace")
        new, self.pos = text[self.pos :], len(text)
        return new


def _complete(c, prompt: str, slot: int = -1) -> dict:
    r = c.post("/completion", json={"prompt": prompt, "id_slot": slot, "cache_prompt": True})
    assert r.status_code == 200, r.text
    return r.json()


def test_idle_slot_cleared_on_launch_comes_back_from_ram(tmp_path: Path) -> None:
    server = start_server(tmp_path, *ARGS)
    try:
        log = _Log(server.log)
        assert "__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__" in log.drain()
        with server.client() as c:
            first = _complete(c, LONG_PROMPT, 0)["timings"]["prompt_n"]
            assert "__TEST_TAG_CACHE_IDLE_SLOT__" not in log.drain()  # slot 1 holds nothing
            _complete(c, "The quick brown fox", 1)
            assert "__TEST_TAG_CACHE_IDLE_SLOT__" in log.drain()  # slot 0 saved, then cleared
            again = _complete(c, LONG_PROMPT)["timings"]
            assert "updating prompt cache" in log.drain()
            assert again["cache_n"] > 0 and again["prompt_n"] < first
            _complete(c, LONG_PROMPT + " The knight finally reached the castle gates.")
            assert "__TEST_TAG_CACHE_IDLE_SLOT__" not in log.drain()
    finally:
        stop_server(server)


@pytest.mark.parametrize("flags", [("--no-cache-idle-slots",), ("--cache-ram", "0")])
def test_idle_slots_stay_without_the_flag_or_the_ram_cache(tmp_path: Path, flags: tuple[str, ...]) -> None:
    server = start_server(tmp_path, *ARGS, *flags)
    try:
        log = _Log(server.log)
        assert "__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__" not in log.drain()
        with server.client() as c:
            _complete(c, LONG_PROMPT, 0)
            _complete(c, "The quick brown fox", 1)
            assert "__TEST_TAG_CACHE_IDLE_SLOT__" not in log.drain()
            assert _complete(c, LONG_PROMPT)["timings"]["cache_n"] > 40  # slot 0 kept its cache
    finally:
        stop_server(server)
