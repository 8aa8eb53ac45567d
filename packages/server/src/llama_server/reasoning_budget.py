"""`--reasoning-budget N` / a request's `reasoning_budget_tokens`: a token budget for the thinking block.

As llama-server (server-common.cpp, common/reasoning-budget.cpp): only for templates with thinking tags;
the request's `reasoning_budget_tokens` (alias `thinking_budget_tokens`; -1 = the server's) else
`--reasoning-budget`; -1 is unlimited. Once the block is open (the generation prompt opened it, or the
model wrote the start tag) each generated token counts; when N are spent, `reasoning_budget_message`
(else `--reasoning-budget-message`) and the end tag are forced, token by token, and the answer follows.
0 closes the block as soon as it opens. `reasoning_control: true` (the control route ends the block on
demand) and a lazy grammar (a tool call is never triggered inside the block) also get the sampler. The
engine's sampler does the counting and forcing (llama_engine.sampling.reasoning_budget); this module turns
the tags and the message into token ids.
"""

from __future__ import annotations

import msgspec

from llama_engine import GenerationRequest
from llama_engine.sampling import ReasoningBudgetParams
from llama_engine.sampling.reasoning_budget import UNLIMITED
from llama_engine.tokenizer import Tokenizer

from .chat_prompt import PromptResult
from .config import ServerConfig
from .schemas import ChatBody

__all__ = ["budget_params", "with_budget"]


def _budget(body: ChatBody, config: ServerConfig) -> int:
    n = body.reasoning_budget_tokens
    if n is None:
        n = body.thinking_budget_tokens
    return config.reasoning_budget if n is None or n == -1 else n


def budget_params(
    body: ChatBody, config: ServerConfig, tok: Tokenizer, prompt: PromptResult, lazy_grammar: bool = False
) -> ReasoningBudgetParams | None:
    """The sampler's budget for this chat request, or None (no thinking tags, or nothing needs one).

    As common_sampler_init: a budget, `reasoning_control` or a lazy grammar (paused inside the thinking
    block) each need the sampler; without a budget it only tracks the block (UNLIMITED)."""
    start, end = prompt.think_tags
    n = _budget(body, config)
    if not start or not end or (n < 0 and not body.reasoning_control and not lazy_grammar):
        return None
    n = UNLIMITED if n < 0 else n

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok.encode(text, add_special=False, parse_special=True))

    message = body.reasoning_budget_message
    if message is None:
        message = config.reasoning_budget_message
    end_ids = ids(end)
    forced = (ids(message) if message else ()) + end_ids
    # the generation prompt that opened the block counts as the start tag (llama.cpp feeds it first)
    prefill = ids(start) if prompt.thinking_open else ()
    return ReasoningBudgetParams(n, ids(start), (end_ids,), forced, prefill)


def with_budget(
    reqs: list[GenerationRequest], budget: ReasoningBudgetParams | None
) -> list[GenerationRequest]:
    """The requests with the budget in their sampling parameters."""
    if budget is None:
        return reqs
    return [
        msgspec.structs.replace(r, sampling=msgspec.structs.replace(r.sampling, reasoning_budget=budget))
        for r in reqs
    ]
