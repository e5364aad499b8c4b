"""A small regular-expression language over bytes: the parser, and Brzozowski derivatives as the reference.

The schema compiler (schema.py) writes its patterns in this syntax, the automaton
(automaton.py) is built from the tree `parse` returns, and `derivative` answers the one
question the token masks must get right, "can this prefix still be completed?", straight
from the tree, without the NFA or the DFA: the tests hold the masks against it.

Syntax: literals; `\\` escapes a special character (`\\{`, `\\"`, `\\.`) and gives `\\d`;
`[...]` classes with ranges (`[a-z0-9 ]`); `( | )`; `*`, `+`, `?`, `{m}`, `{m,n}`.
Trees are plain tuples, so they hash (derivatives are memoized):
("empty",) matches nothing, ("eps",) the empty string, ("bytes", frozenset) one byte,
("cat", (a, b, ...)), ("alt", frozenset({a, b, ...})), ("star", a).
"""

from __future__ import annotations

import functools

EMPTY = ("empty",)
EPS = ("eps",)
SPECIAL = set("()[]{}|*+?\\.")
MAX_REPEAT = 64  # {m,n} is unrolled; a bound keeps a pattern from exploding the automaton


class RegexError(ValueError):
    """A pattern this syntax does not accept; the message names the position."""


# --- smart constructors: with them, a tree is ("empty",) exactly when it matches nothing ---


def chars(values) -> tuple:
    s = frozenset(values)
    return ("bytes", s) if s else EMPTY


def cat(*parts) -> tuple:
    flat = []
    for p in parts:
        if p == EMPTY:
            return EMPTY
        if p == EPS:
            continue
        flat.extend(p[1] if p[0] == "cat" else (p,))
    if not flat:
        return EPS
    return flat[0] if len(flat) == 1 else ("cat", tuple(flat))


def alt(*parts) -> tuple:
    flat = set()
    for p in parts:
        if p == EMPTY:
            continue
        flat.update(p[1] if p[0] == "alt" else (p,))
    if not flat:
        return EMPTY
    return next(iter(flat)) if len(flat) == 1 else ("alt", frozenset(flat))


def star(p) -> tuple:
    if p in (EMPTY, EPS):
        return EPS
    return p if p[0] == "star" else ("star", p)


def repeat(p, lo: int, hi: int | None) -> tuple:
    """p{lo,hi}; hi None is unbounded. x{0,3} becomes (x(x(x)?)?)?, which keeps the NFA linear in hi."""
    head = cat(*([p] * lo))
    if hi is None:
        return cat(head, star(p))
    tail = EPS
    for _ in range(hi - lo):
        tail = alt(EPS, cat(p, tail))
    return cat(head, tail)


# --- the parser ---


class _Parser:
    def __init__(self, text: str):
        try:
            self.data = text.encode("ascii")
        except UnicodeEncodeError:
            raise RegexError("patterns are ASCII; write other bytes as a class of their codes") from None
        self.i = 0

    def peek(self) -> str | None:
        return chr(self.data[self.i]) if self.i < len(self.data) else None

    def take(self) -> str:
        c = self.peek()
        if c is None:
            raise RegexError(f"pattern ends early at {self.i}")
        self.i += 1
        return c

    def alternation(self) -> tuple:
        branches = [self.concat()]
        while self.peek() == "|":
            self.take()
            branches.append(self.concat())
        return alt(*branches)

    def concat(self) -> tuple:
        parts = []
        while self.peek() not in (None, "|", ")"):
            parts.append(self.quantified())
        return cat(*parts)

    def quantified(self) -> tuple:
        node = self.atom()
        while self.peek() in ("*", "+", "?", "{"):
            q = self.take()
            if q == "*":
                node = star(node)
            elif q == "+":
                node = cat(node, star(node))
            elif q == "?":
                node = alt(EPS, node)
            else:
                node = self.bounds(node)
        return node

    def bounds(self, node) -> tuple:
        start = self.i
        body = ""
        while self.peek() not in (None, "}"):
            body += self.take()
        if self.peek() != "}":
            raise RegexError(f"'{{' at {start - 1} is not closed")
        self.take()
        lo_text, _, hi_text = body.partition(",")
        if not lo_text.isdigit() or (hi_text and not hi_text.isdigit()):
            raise RegexError(f"bad repeat {{{body}}} at {start - 1}; write {{m}} or {{m,n}}")
        lo = int(lo_text)
        hi = lo if "," not in body else (int(hi_text) if hi_text else None)
        if (hi is not None and hi < lo) or max(lo, hi or 0) > MAX_REPEAT:
            raise RegexError(f"repeat {{{body}}} at {start - 1}: need m <= n <= {MAX_REPEAT}")
        return repeat(node, lo, hi)

    def escape(self) -> set[int]:
        c = self.take()
        if c == "d":
            return set(range(ord("0"), ord("9") + 1))
        if c.isalnum():
            raise RegexError(f"unknown escape \\{c} at {self.i - 2}")
        return {ord(c)}

    def atom(self) -> tuple:
        c = self.take()
        if c == "(":
            node = self.alternation()
            if self.peek() != ")":
                raise RegexError(f"'(' at {self.i} is not closed")
            self.take()
            return node
        if c == "[":
            return chars(self.klass())
        if c == "\\":
            return chars(self.escape())
        if c in SPECIAL:
            raise RegexError(f"'{c}' at {self.i - 1} must be escaped")
        return chars({ord(c)})

    def klass(self) -> set[int]:
        out: set[int] = set()
        first = True
        while first or self.peek() != "]":
            first = False
            c = self.take()
            lo = self.escape() if c == "\\" else {ord(c)}
            if self.peek() == "-" and self.i + 1 < len(self.data) and chr(self.data[self.i + 1]) != "]":
                self.take()
                d = self.take()
                hi = self.escape() if d == "\\" else {ord(d)}
                if len(lo) != 1 or len(hi) != 1 or min(lo) > min(hi):
                    raise RegexError(f"bad range in class at {self.i}")
                out.update(range(min(lo), min(hi) + 1))
            else:
                out.update(lo)
        self.take()
        return out


def parse(pattern: str) -> tuple:
    p = _Parser(pattern)
    node = p.alternation()
    if p.peek() is not None:
        raise RegexError(f"unexpected '{p.peek()}' at {p.i}")
    return node


def escape(text: str) -> str:
    """`text` as a literal pattern."""
    return "".join("\\" + c if c in SPECIAL else c for c in text)


# --- derivatives: the reference the masks are tested against ---


@functools.lru_cache(maxsize=None)
def nullable(node) -> bool:
    kind = node[0]
    if kind in ("eps", "star"):
        return True
    if kind in ("empty", "bytes"):
        return False
    if kind == "cat":
        return all(nullable(p) for p in node[1])
    return any(nullable(p) for p in node[1])


@functools.lru_cache(maxsize=None)
def derivative(node, byte: int) -> tuple:
    """The strings s such that bytes([byte]) + s matches `node`."""
    kind = node[0]
    if kind in ("empty", "eps"):
        return EMPTY
    if kind == "bytes":
        return EPS if byte in node[1] else EMPTY
    if kind == "star":
        return cat(derivative(node[1], byte), node)
    if kind == "alt":
        return alt(*(derivative(p, byte) for p in node[1]))
    head, rest = node[1][0], cat(*node[1][1:])
    d = cat(derivative(head, byte), rest)
    return alt(d, derivative(rest, byte)) if nullable(head) else d


def viable(node, data: bytes) -> bool:
    """Whether `data` is a prefix of some string `node` matches."""
    for b in data:
        node = derivative(node, b)
        if node == EMPTY:
            return False
    return True
