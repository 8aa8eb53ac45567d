"""Splitting text at special-token texts before tokenizing (llama.cpp's `tokenizer_st_partition`).

llama.cpp takes the special tokens longest first and, for each, cuts every remaining text fragment at all of
its occurrences. Control and unknown tokens take part only when `parse_special` is true (so user text cannot
inject `<|im_start|>`); user-defined tokens always do. To avoid scanning the text once per special token
(Gemma has 6,000), one regex finds which special tokens occur at all, and only those are applied, in order.
"""

from __future__ import annotations

import re

from .vocab import TokenAttr, Vocab

__all__ = ["Fragment", "SpecialSplitter"]

Fragment = str | int  # raw text, or a token id
_ASCII_SPACE = " \t\n\v\f\r"  # C isspace()
_END = ""  # trie key marking "a token ends here"
_RUN = re.compile(r"(.)\1+", re.DOTALL)


class _Finder:
    """Finds which special tokens of one mode occur in a text.

    The token texts form a trie, compiled (on first use) into one regex of nested groups, optional where a
    token ends, that matches the longest token starting at a position. Looked for at every position (inside
    a lookahead) it yields each longest match, and every token occurring anywhere is a prefix of one of them.
    Runs of one character longer than any run inside a token are shortened first: that keeps the set of
    tokens present and bounds the work on hostile text like 100k spaces.
    """

    __slots__ = ("_entries", "_entries_only", "_pattern", "_prefix_ranks", "_root", "_runs", "empty")

    def __init__(self, entries: list[tuple[int, str]]) -> None:
        # entries: (rank in llama.cpp's order, text)
        root: dict = {}
        longest_run = 1
        for rank, text in entries:
            node = root
            for ch in text:
                node = node.setdefault(ch, {})
            node[_END] = rank
            longest_run = max([longest_run, *(len(m.group()) for m in _RUN.finditer(text))])
        self._root = root
        self._entries = entries
        self.empty = not root
        cap = longest_run + 1
        self._runs = (re.compile(f"(.)\\1{{{cap},}}", re.DOTALL), cap)
        self._prefix_ranks: dict[str, list[int]] = {}
        self._pattern: re.Pattern[str] | None = None
        self._entries_only = False

    @classmethod
    def _regex(cls, node: dict) -> str:
        alts = []
        for ch, child in node.items():
            if ch == _END:
                continue
            literal = re.escape(ch)
            while len(child) == 1 and _END not in child:  # a chain without branches is one literal
                ((ch, child),) = child.items()
                literal += re.escape(ch)
            if len(child) == 1:  # only _END: a token ends here and nothing longer follows
                alts.append(literal)
            else:
                alts.append(literal + "(?:" + cls._regex(child) + ")" + ("?" if _END in child else ""))
        return "|".join(alts)

    def present(self, text: str) -> list[int]:
        """Ranks of the special tokens that occur somewhere in `text`, sorted."""
        if self._pattern is None:
            try:
                self._pattern = re.compile("(?=(" + self._regex(self._root) + "))")
            except (RecursionError, re.error, OverflowError):
                self._entries_only = True
        if self._entries_only:  # tokens nest too deeply for one regex: a substring search per token
            return sorted(rank for rank, tok in self._entries if tok in text)
        assert self._pattern is not None
        runs, cap = self._runs
        text = runs.sub(lambda m: m.group(1) * cap, text)
        found: set[int] = set()
        for longest in set(self._pattern.findall(text)):
            ranks = self._prefix_ranks.get(longest)
            if ranks is None:
                ranks = self._prefix_ranks[longest] = self._prefixes(longest)
            found.update(ranks)
        return sorted(found)

    def _prefixes(self, text: str) -> list[int]:
        ranks = []
        node = self._root
        for ch in text:
            node = node[ch]
            if _END in node:
                ranks.append(node[_END])
        return ranks


class SpecialSplitter:
    """Cuts text into raw fragments and special-token ids, as llama.cpp does before tokenizing."""

    __slots__ = ("_finders", "_ids", "_strip", "_texts")

    def __init__(self, vocab: Vocab) -> None:
        order = vocab.special_order
        self._ids = order
        self._texts = [vocab.tokens[t] for t in order]
        lstrip, rstrip = int(TokenAttr.LSTRIP), int(TokenAttr.RSTRIP)
        self._strip = [(bool(vocab.attrs[t] & lstrip), bool(vocab.attrs[t] & rstrip)) for t in order]
        skip = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)
        all_entries = [(r, vocab.tokens[t]) for r, t in enumerate(order)]
        user_entries = [(r, vocab.tokens[t]) for r, t in enumerate(order) if not vocab.attrs[t] & skip]
        self._finders = {True: _Finder(all_entries), False: _Finder(user_entries)}

    def split(self, text: str, parse_special: bool) -> list[Fragment]:
        """`text` as a list of raw-text fragments (str) and special token ids (int), in order."""
        if not text:
            return []
        finder = self._finders[parse_special]
        if finder.empty:
            return [text]
        ranks = finder.present(text)
        if not ranks:
            return [text]
        frags: list[tuple[int, int] | int] = [(0, len(text))]
        for rank in ranks:
            frags = self._cut(text, frags, self._texts[rank], self._ids[rank], *self._strip[rank])
        return [text[f[0] : f[1]] if isinstance(f, tuple) else f for f in frags]

    @staticmethod
    def _cut(
        text: str, frags: list[tuple[int, int] | int], needle: str, tid: int, lstrip: bool, rstrip: bool
    ) -> list[tuple[int, int] | int]:
        out: list[tuple[int, int] | int] = []
        for frag in frags:
            if isinstance(frag, int):
                out.append(frag)
                continue
            a, b = frag
            while True:
                m = text.find(needle, a, b)
                if m < 0:
                    break
                left_end = m
                if lstrip:
                    while left_end > a and text[left_end - 1] in _ASCII_SPACE:
                        left_end -= 1
                if left_end > a:
                    out.append((a, left_end))
                out.append(tid)
                a = m + len(needle)
                if rstrip:
                    while a < b and text[a] in _ASCII_SPACE:
                        a += 1
            if a < b:
                out.append((a, b))
        return out
