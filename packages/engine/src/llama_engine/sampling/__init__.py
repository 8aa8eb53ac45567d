"""Token sampling as llama.cpp does it: the sampler chain, its parameters and seeded randomness.

```python
from llama_engine.sampling import Sampler, SamplingParams

sampler = Sampler(SamplingParams(seed=42, top_k=40), n_vocab)
sampler.accept_many(prompt_tokens)
token = sampler.sample(logits)  # logits: float32[n_vocab]
sampler.accept(token)
```
"""

from .chain import Sampler, TokenProbs, warmup
from .dry import DryVocab
from .params import (
    DEFAULT_DRY_SEQUENCE_BREAKERS,
    DEFAULT_SAMPLERS,
    MAX_N_PROBS,
    SAMPLER_NAMES,
    GrammarTrigger,
    SamplingParams,
    TriggerType,
    parse_samplers,
)
from .reasoning_budget import ReasoningBudget, ReasoningBudgetParams
from .rng import LLAMA_DEFAULT_SEED

__all__ = [
    "DEFAULT_DRY_SEQUENCE_BREAKERS",
    "DEFAULT_SAMPLERS",
    "LLAMA_DEFAULT_SEED",
    "MAX_N_PROBS",
    "SAMPLER_NAMES",
    "DryVocab",
    "GrammarTrigger",
    "ReasoningBudget",
    "ReasoningBudgetParams",
    "Sampler",
    "SamplingParams",
    "TokenProbs",
    "TriggerType",
    "parse_samplers",
    "warmup",
]
