"""The `/infill` prompt: llama-server's fill-in-the-middle layout, with the repo-level form
(`<FIM_REP>project`, `<FIM_SEP>filename` per extra chunk) when the model has those tokens (endpoints.md §15)."""

from __future__ import annotations

from typing import Any

from .errors import ApiError
from .prompts import check_text_size, encode, tokenize_mixed
from .schemas import InfillBody, InfillExtra
from .state import ServerState

__all__ = ["infill_prompt"]

_SNIPPET = "\n\n--- snippet ---\n\n"  # the chunk separator of models without <FIM_SEP>


async def infill_prompt(server: ServerState, body: InfillBody) -> list[int]:
    """`[extra][BOS?][PRE]prefix prompt[SUF]suffix[MID]` (`--spm-infill`: the suffix part first). The
    prefix keeps its last 3/4 of a batch, the suffix what is left of the batch's quarter, the extra context
    its last `n_ctx - n_batch - 2 * n_predict` tokens, as llama-server cuts them."""
    engine = server.require_engine()
    tok, cfg = engine.tokenizer, server.config
    if body.input_prefix is None or body.input_suffix is None:
        raise ApiError('"input_prefix" and "input_suffix" are required')
    pieces = (body.input_prefix, body.input_suffix)
    check_text_size(sum(len(x) for x in pieces if isinstance(x, str)), tok, engine.n_ctx_slot)

    async def enc(v: str | list[Any], special: bool = False) -> list[int]:
        if isinstance(v, str):
            return await encode(server, v, add_special=False, parse_special=special)
        return tokenize_mixed(v, tok, parse_special=False, add_special=False)

    n_batch = cfg.n_batch
    prefix = await enc(body.input_prefix)
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (n_batch // 4)) :]
    prompt = await enc(body.prompt, special=True) if isinstance(body.prompt, str) else []
    suffix = (await enc(body.input_suffix))[: max(0, n_batch // 4 - 2 - len(prompt))]
    extra = await _extra_context(server, body.input_extra or [], enc)
    n_extra = min(max(0, engine.n_ctx_slot - n_batch - 2 * cfg.n_predict), len(extra))
    extra = extra[len(extra) - n_extra :]
    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    fim = tok.fim_ids
    pre: list[int] = [fim["pre"], *prefix, *prompt]  # type: ignore[list-item]
    suf: list[int] = [fim["suf"], *suffix]  # type: ignore[list-item]
    first, last = (suf, pre) if cfg.spm_infill else (pre, suf)
    return [*extra, *bos, *first, *last, fim["mid"]]  # type: ignore[list-item]


async def _extra_context(server: ServerState, chunks: list[InfillExtra], enc: Any) -> list[int]:
    """The extra chunks: `<FIM_REP>myproject\\n`, then per chunk `<FIM_SEP>{filename or tmp}\\n{text}`,
    then `<FIM_SEP>filename\\n` (the file being edited); without those tokens, snippet separators."""
    fim = server.require_engine().tokenizer.fim_ids
    rep, sep = fim["rep"], fim["sep"]
    out: list[int] = [rep, *await enc("myproject\n")] if rep is not None else []
    for chunk in chunks:
        if sep is not None:
            out += [sep, *await enc((chunk.filename if chunk.filename is not None else "tmp") + "\n")]
        else:
            out += await enc(_SNIPPET)
        out += await enc(chunk.text)
    if sep is not None:
        out += [sep, *await enc("filename\n")]
    return out
