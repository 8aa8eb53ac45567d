"""Constrained decoding with llama.cpp's GBNF grammars.

```python
from llama_engine.grammar import GrammarError, parse_grammar

grammar = parse_grammar('root ::= "yes" | "no"')  # raises GrammarError with llama.cpp's message
```

The sampler applies a grammar through ``SamplingParams(grammar=...)``; ``GrammarMatcher`` is the
per-sequence state (llama.cpp's ``llama_grammar`` stacks) and ``TokenTrie`` the per-vocabulary
structure that checks every token against it at once.
"""

from .elements import Element, ElementType, Grammar, GrammarError, GrammarStopError
from .parser import MAX_ELEMENTS, MAX_NESTING, MAX_REPETITION_THRESHOLD, bind_tokens, parse_grammar

__all__ = [
    "MAX_ELEMENTS",
    "MAX_NESTING",
    "MAX_REPETITION_THRESHOLD",
    "Element",
    "ElementType",
    "Grammar",
    "GrammarError",
    "GrammarStopError",
    "bind_tokens",
    "parse_grammar",
]
