"""The vocabulary as the grammar sees it, and the check of every token against a grammar state at once.

Every token's piece (``token_to_piece`` with special tokens rendered, as llama.cpp's grammar reads it)
is decoded to code points once, and the code point strings go into a trie laid out in depth-first
order. ``allowed`` walks the trie against a state: a shared prefix is stepped once for all the tokens
that start with it, and a prefix no stack accepts skips its whole subtree. The result is exactly
``llama_grammar_apply_impl``'s: the tokens it would not set to -inf.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .compiled import DEAD, CompiledGrammar
from .utf8 import NO_PARTIAL, Partial, decode_utf8
from .walk import StepTable, compile_walk, walk_trie

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer

__all__ = ["GrammarVocab"]

_MASK_CACHE_BYTES = 32 << 20  # allowed-token masks kept per grammar, by state


class GrammarVocab:
    """Token pieces, their code points and the trie over them (built once per vocabulary)."""

    def __init__(self, pieces: Sequence[bytes], eog: Iterable[int]) -> None:
        n = len(pieces)
        self.n_vocab = n
        self.pieces = list(pieces)
        self.eog = np.zeros(n, dtype=bool)
        for t in eog:
            if 0 <= t < n:
                self.eog[t] = True
        self.cps: list[list[int]] = [[] for _ in range(n)]
        self.partials: list[Partial] = [NO_PARTIAL] * n
        self.never = np.zeros(n, dtype=bool)  # empty piece or a leading NUL: always rejected
        self.after_partial: list[int] = []  # tokens that may continue a partial UTF-8 sequence
        for t, piece in enumerate(self.pieces):
            if self.eog[t]:
                continue
            if not piece or piece[0] == 0:
                self.never[t] = True
                continue
            if 0x80 <= piece[0] <= 0xBF:
                self.after_partial.append(t)
            # invalid on its own (INVALID): rejected, unless it goes on with a partial sequence
            self.cps[t], self.partials[t] = decode_utf8(piece)
        self._build_trie()

    @classmethod
    def from_tokenizer(cls, tok: Tokenizer) -> GrammarVocab:
        """From a model's tokenizer: pieces with special tokens rendered; end-of-generation tokens."""
        vocab = cls([tok.token_to_piece(t, True) for t in range(tok.n_vocab)], tok.eog_ids)
        compile_walk()  # built off the engine thread: the walk's kernel is made ready here too
        return vocab

    def _build_trie(self) -> None:
        children: list[dict[int, int]] = [{}]
        own: list[list[int]] = [[]]
        for t in range(self.n_vocab):
            if self.eog[t] or self.never[t] or self.partials[t][1] < 0:
                continue
            node = 0
            for cp in self.cps[t]:
                nxt = children[node].get(cp)
                if nxt is None:
                    nxt = children[node][cp] = len(children)
                    children.append({})
                    own.append([])
                node = nxt
            own[node].append(t)
        # depth-first layout: node i's subtree is nodes [i, end[i]); its tokens are order[lo[i]:sub[i]],
        # its own complete tokens order[lo[i]:mid[i]], its own partial ones order[mid[i]:hi[i]]
        cp_of: list[int] = []
        depth: list[int] = []
        end: list[int] = []
        lo: list[int] = []
        mid: list[int] = []
        hi: list[int] = []
        sub: list[int] = []
        order: list[int] = []
        partials = self.partials
        todo: list[tuple[int, int, int]] = [(0, -1, 0)]
        while todo:
            node, cp, d = todo.pop()
            if node < 0:  # closing a subtree
                i = ~node
                end[i], sub[i] = len(cp_of), len(order)
                continue
            i = len(cp_of)
            cp_of.append(cp)
            depth.append(d)
            end.append(0)
            sub.append(0)
            lo.append(len(order))
            mine = own[node]
            order.extend(t for t in mine if partials[t] == NO_PARTIAL)
            mid.append(len(order))
            order.extend(t for t in mine if partials[t] != NO_PARTIAL)
            hi.append(len(order))
            todo.append((~i, 0, 0))
            for c, child in children[node].items():
                todo.append((child, c, d + 1))
        self._cp, self._depth, self._end = cp_of, depth, end
        self._lo, self._mid, self._hi, self._sub = lo, mid, hi, sub
        self._order = np.asarray(order, dtype=np.int32)
        self._max_depth = max(depth) if depth else 0
        self._flag = [m != h for m, h in zip(mid, hi, strict=True)]  # node has partial tokens
        self._partial_nodes = np.flatnonzero(np.asarray(self._flag, dtype=bool))
        # for the compiled walk: arrays, each node's code point as a dense column, each complete token's node
        self._depth_a = np.asarray(depth, dtype=np.int32)
        self._end_a = np.asarray(end, dtype=np.int32)
        cols: dict[int, int] = {}
        self._col = np.asarray([cols.setdefault(c, len(cols)) for c in cp_of], dtype=np.int32)
        self._n_cols = len(cols)
        # each position of `order`: its node for a complete piece, node 0 (which no walk marks) for a partial one
        lo_a, mid_a, hi_a = (np.asarray(x, dtype=np.int64) for x in (lo, mid, hi))
        nodes = np.arange(len(cp_of), dtype=np.int64)
        self._tok_node = np.repeat(
            np.stack([nodes, np.zeros_like(nodes)], 1).ravel(),
            np.stack([mid_a - lo_a, hi_a - mid_a], 1).ravel(),
        )

    # -- one token --------------------------------------------------------------------------------------

    def allows(self, g: CompiledGrammar, sid: int, partial: Partial, token: int) -> bool:
        """Whether the grammar state keeps ``token`` (llama_grammar_apply_impl on that token alone)."""
        if self.eog[token]:
            return g.can_end[sid]
        if self.never[token]:
            return False
        if partial == NO_PARTIAL:
            cps, p = self.cps[token], self.partials[token]
        else:
            cps, p = decode_utf8(self.pieces[token], partial)
        return accepts(g, sid, cps, p, token)

    # -- every token ------------------------------------------------------------------------------------

    def allowed(self, g: CompiledGrammar, sid: int, partial: Partial) -> np.ndarray:
        """Bool mask over the vocabulary: the tokens the grammar state keeps (read-only, cached)."""
        cache: OrderedDict[int, np.ndarray] | None = None
        if partial == NO_PARTIAL:
            cache = g.masks.get(self)
            if cache is None:
                cache = g.masks[self] = OrderedDict()
            hit = cache.get(sid)
            if hit is not None:
                cache.move_to_end(sid)
                return hit
        if partial != NO_PARTIAL:
            mask = self._after_partial(g, sid, partial)
        elif g.has_tokens:
            mask = self._walk(g, sid)
        else:
            mask = self._walk_compiled(g, sid)
        if g.can_end[sid]:
            mask |= self.eog
        mask.flags.writeable = False
        if cache is not None:
            cache[sid] = mask
            if len(cache) * self.n_vocab > _MASK_CACHE_BYTES:
                cache.popitem(last=False)
        return mask

    def _after_partial(self, g: CompiledGrammar, sid: int, partial: Partial) -> np.ndarray:
        # only a piece that starts with continuation bytes can go on with a partial sequence
        mask = np.zeros(self.n_vocab, dtype=bool)
        for t in self.after_partial:
            cps, p = decode_utf8(self.pieces[t], partial)
            mask[t] = accepts(g, sid, cps, p, t)
        return mask

    def _walk(self, g: CompiledGrammar, sid: int) -> np.ndarray:
        cp_of, depth, end, flag = self._cp, self._depth, self._end, self._flag
        steps = g.steps
        step = g.step
        token_grammar = g.has_tokens
        states = [DEAD] * (self._max_depth + 1)
        states[0] = sid
        hits: list[int] = []  # nodes whose own complete tokens are kept
        singles: list[int] = []  # tokens kept one by one (partial pieces, token elements)
        if token_grammar:
            self._token_tops(g, sid, 0, singles)
        self._partials_at(g, sid, 0, singles)
        n = len(cp_of)
        i = 1
        while i < n:
            d = depth[i]
            prev = states[d - 1]
            s = steps[prev].get(cp_of[i])
            if s is None:
                s = step(prev, cp_of[i])
            if s == DEAD:
                i = end[i]
                continue
            states[d] = s
            hits.append(i)
            if flag[i]:
                self._partials_at(g, s, i, singles)
            if token_grammar:
                self._token_tops(g, s, i, singles)
            i += 1
        mask = np.zeros(self.n_vocab, dtype=bool)
        if hits:
            h = np.asarray(hits, dtype=np.int64)
            lo = np.asarray(self._lo, dtype=np.int64)[h]
            mid = np.asarray(self._mid, dtype=np.int64)[h]
            delta = np.zeros(len(self._order) + 1, dtype=np.int32)
            np.add.at(delta, lo, 1)
            np.add.at(delta, mid, -1)
            mask[self._order[np.cumsum(delta[:-1]) > 0]] = True
        if singles:
            mask[np.asarray(singles, dtype=np.int64)] = True
        return mask

    def _walk_compiled(self, g: CompiledGrammar, sid: int) -> np.ndarray:
        """``_walk`` for grammars without token elements, its loop compiled (walk.py)."""
        table = g.tables.get(self)
        if table is None:
            table = g.tables[self] = StepTable(self._n_cols)
        node_state = walk_trie(
            g, table, sid, self._depth_a, self._end_a, self._col, self._cp, self._max_depth
        )
        mask = np.zeros(self.n_vocab, dtype=bool)
        mask[self._order[node_state[self._tok_node] != 0]] = True  # the root (node 0) keeps 0: no token
        singles: list[int] = []
        for i in self._partial_nodes.tolist():
            s = sid if i == 0 else int(node_state[i])
            if s:
                self._partials_at(g, s, i, singles)
        if singles:
            mask[np.asarray(singles, dtype=np.int64)] = True
        return mask

    def _partials_at(self, g: CompiledGrammar, s: int, i: int, out: list[int]) -> None:
        order = self._order
        for k in range(self._mid[i], self._hi[i]):
            t = int(order[k])
            if g.match_partial(s, self.partials[t]):
                out.append(t)

    def _token_tops(self, g: CompiledGrammar, s: int, i: int, out: list[int]) -> None:
        """Tokens that go on past node i are kept by a token element on top of a stack when their id
        matches it (llama.cpp checks the id even part way through a token's characters)."""
        tops = g.token_tops[s]
        if not tops:
            return
        below = self._order[self._hi[i] : self._sub[i]]
        for stack in tops:
            v = g.values[stack[-1]]
            keep = below[below == v] if g.token_matches(stack, v) else below[below != v]  # TOKEN, TOKEN_NOT
            out.extend(keep.tolist())


def accepts(g: CompiledGrammar, sid: int, cps: list[int], partial: Partial, token: int) -> bool:
    """llama_grammar_reject_candidates for one decoded token, over every stack of the state."""
    s = sid
    tops = g.token_tops
    for cp in cps:
        if tops[s] and any(g.token_matches(st, token) for st in tops[s]):
            return True
        s = g.step(s, cp)
        if s == DEAD:
            return False
    if partial[1] == 0:
        return True
    return g.match_partial(s, partial)
