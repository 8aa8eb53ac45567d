"""The model's memory beside the KV cache: per-sequence recurrent state (``recurrent_state``).

A model with recurrent layers (lfm2's short convolutions, Mamba-2) gets a ``KVCache`` whose pools are its
attention layers' cells and one ``RecurrentPool`` for its recurrent layers: llama.cpp's
``llama_memory_hybrid``, with one set of per-sequence operations for both.
"""

from __future__ import annotations

from .recurrent_state import RecurrentPool

__all__ = ["RecurrentPool"]
