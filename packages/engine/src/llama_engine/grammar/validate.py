"""The checks llama.cpp makes before a grammar is used: undefined rules, the start symbol, left recursion.

Left recursion is found as ``llama_grammar_detect_left_recursion`` does (a rule "may be empty" when one of
its alternates is empty; leftmost references are followed past such rules), with an explicit stack and
a memo of rules already found free of it, so a long or wide chain of rules costs linear time.
"""

from __future__ import annotations

from .elements import Element, ElementType, Grammar, GrammarError

__all__ = ["check_grammar"]

_T = ElementType
_PREFIX = "parse: error parsing grammar: "


def check_grammar(
    rules: list[list[Element] | None],
    symbol_ids: dict[str, int],
    text: str,
    token_names: tuple[str, ...],
    root: str,
) -> Grammar:
    """A Grammar from parsed rules, or GrammarError naming the first problem."""
    names = {v: k for k, v in symbol_ids.items()}
    n = len(rules)
    for i, rule in enumerate(rules):  # in id order, as llama.cpp's check after parsing
        if rule is None:
            raise GrammarError(f"{_PREFIX}Undefined rule identifier '{names.get(i, i)}'")
        for t, v in rule:
            if t == _T.RULE_REF and (v >= n or rules[v] is None):
                raise GrammarError(f"{_PREFIX}Undefined rule identifier '{names.get(v, v)}'")
    if not rules:
        raise GrammarError(f"{_PREFIX}the grammar has no rules")
    if root not in symbol_ids:
        raise GrammarError(f"grammar does not contain a '{root}' symbol")
    frozen = tuple(tuple(r) for r in rules if r is not None)
    bad = _left_recursive(frozen)
    if bad >= 0:
        raise GrammarError(
            f"unsupported grammar, left recursion detected for nonterminal at index {bad} ('{names[bad]}')"
        )
    return Grammar(frozen, dict(symbol_ids), text, token_names, root)


def _is_end(t: int) -> bool:
    return t == _T.END or t == _T.ALT


def _may_be_empty(rule: tuple[Element, ...]) -> bool:
    at_start = True
    for t, _ in rule:
        if _is_end(t):
            if at_start:
                return True
            at_start = True
        else:
            at_start = False
    return False


def _left_recursive(rules: tuple[tuple[Element, ...], ...]) -> int:
    """The first top-level rule index from which left recursion is found, or -1."""
    n = len(rules)
    visited = [False] * n
    in_progress = [False] * n
    empty = [_may_be_empty(r) for r in rules]
    for top in range(n):
        if visited[top]:
            continue
        # frames: [rule, next element index, recurse into the next nonterminal]
        in_progress[top] = True
        frames = [[top, 0, True]]
        while frames:
            f = frames[-1]
            r, i, recurse = f
            rule = rules[r]
            pushed = False
            while i < len(rule):
                t, v = rule[i]
                i += 1
                if t == _T.RULE_REF and recurse:
                    if in_progress[v]:
                        return top
                    if not empty[v]:
                        recurse = False
                    if not visited[v]:
                        f[1], f[2] = i, recurse
                        in_progress[v] = True
                        frames.append([v, 0, True])
                        pushed = True
                        break
                elif _is_end(t):
                    recurse = True
                elif t != _T.RULE_REF:
                    recurse = False
            if pushed:
                continue
            in_progress[r] = False
            visited[r] = True
            frames.pop()
    return -1
