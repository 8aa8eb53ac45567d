"""ModelHeader and TokenizerData built from the real models' metadata."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gguf_io


def test_smollm2_header_and_tokenizer(smollm2_path: str) -> None:
    with gguf_io.open(smollm2_path) as f:
        h, tok = f.header, f.tokenizer
    assert (h.architecture, h.block_count, h.embedding_length, h.context_length) == ("llama", 30, 576, 8192)
    assert (h.head_count, h.head_count_kv, h.key_length, h.value_length) == (9, 3, 64, 64)
    assert h.feed_forward_length == 1536 and h.vocab_size == 49152 and h.rope_freq_base == 100000.0
    assert h.layer_norm_rms_epsilon == pytest.approx(1e-5) and h.sliding_window is None
    assert (tok.model, tok.pre, tok.n_tokens) == ("gpt2", "smollm", 49152)
    assert tok.merges is not None and len(tok.merges) == 48900 and tok.merges[0] == "Ġ t"
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (1, 2, 0, 2)
    assert tok.add_bos is False and tok.scores is None
    assert tok.token_types is not None and tok.token_types.dtype == np.int32 and tok.token_types[0] == 3
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template
    assert tok.tokens[1] == "<|im_start|>"


def test_gemma3_header_and_tokenizer(gemma3_path: str) -> None:
    with gguf_io.open(gemma3_path) as f:
        h, tok = f.header, f.tokenizer
    assert (h.architecture, h.block_count, h.embedding_length) == ("gemma3", 18, 640)
    assert (h.head_count, h.head_count_kv, h.key_length, h.value_length) == (4, 1, 256, 256)
    assert h.sliding_window == 512 and h.rope_freq_base == 1e6 and h.vocab_size == 262144
    assert (tok.model, tok.pre, tok.n_tokens) == ("llama", "default", 262144)
    assert tok.scores is not None and tok.scores.dtype == np.float32 and len(tok.scores) == 262144
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (2, 1, 3, 0)
    assert tok.add_bos is True and tok.add_eos is False and tok.merges is None
    assert tok.chat_template is None


def test_views_are_frozen(smollm2_path: str) -> None:
    with gguf_io.open(smollm2_path) as f:
        with pytest.raises(dataclasses.FrozenInstanceError):
            f.header.block_count = 1  # type: ignore[misc]
        assert f.header is f.header  # built once
