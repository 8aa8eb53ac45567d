"""Tokenizers built from GGUF metadata, token for token identical to llama.cpp's.

`Tokenizer.from_file(gguf_file)` gives `encode` (llama_tokenize), `decode` / `detokenize` (llama_detokenize),
`token_to_piece` (llama_token_to_piece), `is_eog` and a `StreamingDetokenizer` for generated ids.
SentencePiece-style ("llama"), GPT-2 byte-level BPE ("gpt2", with the pre-tokenizer named by
`tokenizer.ggml.pre`, and "gemma4"), WordPiece ("bert") and unigram ("t5") vocabularies are supported.
"""

from .detok import StreamingDetokenizer
from .pretokenize import PRE_TOKENIZERS, PreTokenizer, PreTokenizerConfig
from .tokenizer import Tokenizer
from .vocab import TokenAttr, Vocab, VocabType

__all__ = [
    "PRE_TOKENIZERS",
    "PreTokenizer",
    "PreTokenizerConfig",
    "StreamingDetokenizer",
    "TokenAttr",
    "Tokenizer",
    "Vocab",
    "VocabType",
]
