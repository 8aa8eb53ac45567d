"""Tables over the whole vocabulary that samplers need (DRY's token texts), built off the engine thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from .sampling import DryVocab
from .tokenizer import Tokenizer

__all__ = ["build_dry_vocab", "in_background"]

_Table = TypeVar("_Table")


def build_dry_vocab(tok: Tokenizer) -> DryVocab:
    """DRY's view of the vocabulary: every token's text (a scan of the whole vocabulary)."""
    # llama.cpp: vocab.detokenize({t}, remove_special=false, unparse_special=true)
    pieces = [tok.detokenize([t], False, True) for t in range(tok.n_vocab)]
    return DryVocab(
        pieces, lambda b: tok.encode(b.decode("utf-8", "replace"), add_special=False, parse_special=False)
    )


def in_background(fn: Callable[[], _Table], name: str) -> Future[_Table]:
    """Run ``fn`` on a daemon thread named ``name``; its result (or exception) arrives in the future."""
    fut: Future[_Table] = Future()

    def run() -> None:
        try:
            fut.set_result(fn())
        except BaseException as e:  # handed to the requests that wait for it
            fut.set_exception(e)

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut
