"""Speculative decoding: drafters propose tokens, the target verifies them in its next batched pass.

```python
from llama_engine import Engine, EngineConfig
from llama_engine.speculative import DraftParams, SpeculativeConfig, SpecType

spec = SpeculativeConfig(types=(SpecType.DRAFT_SIMPLE,), draft=DraftParams(model="draft.gguf", n_max=8))
engine = Engine("target.gguf", EngineConfig(speculative=spec)).start()
```

Drafters: `draft-simple` (a draft model, `draft_model`), and the model-free `ngram-simple`,
`ngram-map-k`, `ngram-map-k4v` (`ngram`), `ngram-mod` (`ngram_mod`) and `ngram-cache` (`ngram_cache`).
`speculator.Speculator` runs them for all generating slots each step; `verify` holds rejection sampling
and synthetic acceptance. With plain verification (the default) the output equals plain decoding's.
"""

from .config import (
    DraftParams,
    NgramMapParams,
    NgramModParams,
    SpecType,
    SpeculativeConfig,
    parse_spec_types,
    spec_type_names,
)
from .draft_model import check_compatible
from .ngram_cache import NgramCacheError, load_ngram_cache, save_ngram_cache
from .speculator import SpecStats, Speculator

__all__ = [
    "DraftParams",
    "NgramCacheError",
    "NgramMapParams",
    "NgramModParams",
    "SpecStats",
    "SpecType",
    "SpeculativeConfig",
    "Speculator",
    "check_compatible",
    "load_ngram_cache",
    "parse_spec_types",
    "save_ngram_cache",
    "spec_type_names",
]
