"""Regex tree -> NFA (Thompson) -> DFA (subset construction) -> trimmed DFA, over bytes.

Trimming is what makes a token mask exact: after it, every state the table keeps can still
reach an accepting state, so "the walk did not fall off the table" means "the output so far
can still be completed". States that cannot are the dead state, -1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labs.structured import regex

DEAD = -1


class _NFA:
    def __init__(self):
        self.eps: list[list[int]] = []
        self.moves: list[list[tuple[frozenset, int]]] = []

    def state(self) -> int:
        self.eps.append([])
        self.moves.append([])
        return len(self.eps) - 1

    def build(self, node) -> tuple[int, int]:
        """(start, end) of a fragment that matches `node`."""
        s, e = self.state(), self.state()
        kind = node[0]
        if kind == "eps":
            self.eps[s].append(e)
        elif kind == "bytes":
            self.moves[s].append((node[1], e))
        elif kind == "cat":
            at = s
            for part in node[1]:
                ps, pe = self.build(part)
                self.eps[at].append(ps)
                at = pe
            self.eps[at].append(e)
        elif kind == "alt":
            for part in sorted(node[1], key=repr):  # a fixed order: the same pattern, the same state numbers
                ps, pe = self.build(part)
                self.eps[s].append(ps)
                self.eps[pe].append(e)
        elif kind == "star":
            ps, pe = self.build(node[1])
            self.eps[s] += [ps, e]
            self.eps[pe] += [ps, e]
        # "empty": no edge from s to e
        return s, e

    def closure(self, states) -> frozenset:
        seen, stack = set(states), list(states)
        while stack:
            for t in self.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)


@dataclass(frozen=True)
class DFA:
    """`table[state, byte]` is the next state or DEAD; state 0 is the start."""

    table: np.ndarray  # (states, 256) int32
    accepting: np.ndarray  # (states,) bool
    pattern: str = ""

    @property
    def n_states(self) -> int:
        return self.table.shape[0]

    def walk(self, data: bytes, state: int = 0) -> int:
        for b in data:
            if state == DEAD:
                break
            state = int(self.table[state, b])
        return state

    def matches(self, data: bytes) -> bool:
        s = self.walk(data)
        return s != DEAD and bool(self.accepting[s])


def compile_tree(tree, pattern: str = "") -> DFA:
    nfa = _NFA()
    start, end = nfa.build(tree)
    first = nfa.closure([start])
    index = {first: 0}
    order = [first]
    edges: list[dict[int, int]] = []
    i = 0
    while i < len(order):
        current = order[i]
        by_byte: dict[int, set[int]] = {}
        for s in current:
            for values, t in nfa.moves[s]:
                for b in values:
                    by_byte.setdefault(b, set()).add(t)
        row = {}
        for b, targets in by_byte.items():
            nxt = nfa.closure(targets)
            if nxt not in index:
                index[nxt] = len(order)
                order.append(nxt)
            row[b] = index[nxt]
        edges.append(row)
        i += 1
    accepting = [end in s for s in order]
    return _trim(edges, accepting, pattern)


def _trim(edges: list[dict[int, int]], accepting: list[bool], pattern: str) -> DFA:
    """Keep the states that can reach an accepting one, renumbered in first-visit order from the start."""
    n = len(edges)
    back: list[set[int]] = [set() for _ in range(n)]
    for s, row in enumerate(edges):
        for t in row.values():
            back[t].add(s)
    live = {s for s in range(n) if accepting[s]}
    stack = list(live)
    while stack:
        for p in back[stack.pop()]:
            if p not in live:
                live.add(p)
                stack.append(p)
    if 0 not in live:
        raise regex.RegexError(f"pattern {pattern!r} matches nothing")
    new = {0: 0}
    order = [0]
    for s in order:
        for b in sorted(edges[s]):
            t = edges[s][b]
            if t in live and t not in new:
                new[t] = len(order)
                order.append(t)
    table = np.full((len(order), 256), DEAD, dtype=np.int32)
    for s in order:
        for b, t in edges[s].items():
            if t in new:
                table[new[s], b] = new[t]
    acc = np.array([accepting[s] for s in order], dtype=bool)
    return DFA(table, acc, pattern)


def compile_pattern(pattern: str) -> DFA:
    return compile_tree(regex.parse(pattern), pattern)
