"""Per-state token masks: which token ids keep the output completable from each DFA state.

A token is a run of bytes, so it may cross grammar boundaries: `","` closes a string, ends a
field and opens the next key in one step. The mask handles that for free, because it walks a
token's bytes through the DFA one by one, whatever parts of the grammar they belong to.

Three ways to get the mask of a state, the same answer at three costs:
- `Walker.precompute`: every state x every token at once, vectorised over tokens (what an
  Outlines-style index or XGrammar's mask cache pays before decoding starts); a step then
  only looks up a row;
- `Walker.row`: one state's mask, computed when the step needs it (lazy), vectorised;
- `TokenTrie.row`: one state's mask by walking a trie of the vocabulary, which skips every
  token under a prefix the DFA already rejects (the idea behind llguidance's lazy masks).
"""

from __future__ import annotations

import numpy as np

from labs.structured.automaton import DEAD, DFA


class Walker:
    """Walks every token of the vocabulary through the DFA at once, one byte position per numpy step.

    Tokens are sorted longest first, so the tokens still walking at byte k are a prefix of
    that order: a slice, not a boolean mask. The dead state is one more absorbing row.
    """

    def __init__(self, dfa: DFA, token_bytes: list[bytes]):
        self.dfa = dfa
        self.size = len(token_bytes)
        lengths = np.array([len(b) for b in token_bytes], dtype=np.int32)
        self.order = np.argsort(-lengths, kind="stable")
        self.sorted_lengths = lengths[self.order]
        self.live = [int((self.sorted_lengths > k).sum()) for k in range(int(lengths.max()))]
        self.bytes = np.zeros((self.size, len(self.live)), dtype=np.int32)
        for j, t in enumerate(self.order):
            b = token_bytes[t]
            self.bytes[j, : len(b)] = np.frombuffer(b, dtype=np.uint8)
        self.dead = dfa.n_states
        table = np.where(dfa.table == DEAD, self.dead, dfa.table).astype(np.int32)
        self.table = np.vstack([table, np.full((1, 256), self.dead, dtype=np.int32)])
        self.special = np.where(self.sorted_lengths == 0)[0]  # no bytes: the sampler decides about <eos>

    def _finish(self, cur: np.ndarray) -> np.ndarray:
        cur[..., self.special] = self.dead
        out = np.empty_like(cur)
        out[..., self.order] = cur
        return np.where(out == self.dead, DEAD, out).astype(np.int32)

    # --8<-- [start:precompute]
    def precompute(self) -> np.ndarray:
        """next_state[s, t]: the state after token t from state s, or DEAD. Its mask is next_state[s] >= 0."""
        states = self.dfa.n_states
        cur = np.repeat(np.arange(states, dtype=np.int32)[:, None], self.size, axis=1)
        for k, n in enumerate(self.live):  # byte k of every token still walking, for every state at once
            cur[:, :n] = self.table[cur[:, :n], self.bytes[:n, k]]
        return self._finish(cur)
    # --8<-- [end:precompute]

    def row(self, state: int) -> np.ndarray:
        """One state's row, computed when a step needs it (lazy)."""
        cur = np.full(self.size, state, dtype=np.int32)
        for k, n in enumerate(self.live):
            cur[:n] = self.table[cur[:n], self.bytes[:n, k]]
        return self._finish(cur)


class TokenTrie:
    """The vocabulary as a byte trie; a walk from a DFA state visits only prefixes the DFA accepts."""

    def __init__(self, token_bytes: list[bytes]):
        self.children: list[dict[int, int]] = [{}]
        self.ends: list[list[int]] = [[]]
        for tid, b in enumerate(token_bytes):
            node = 0
            for c in b:
                nxt = self.children[node].get(c)
                if nxt is None:
                    nxt = len(self.children)
                    self.children[node][c] = nxt
                    self.children.append({})
                    self.ends.append([])
                node = nxt
            if b:
                self.ends[node].append(tid)

    def row(self, dfa: DFA, state: int, size: int) -> tuple[np.ndarray, int]:
        """(next-state row, trie nodes visited) from `state`."""
        out = np.full(size, DEAD, dtype=np.int32)
        table = dfa.table
        stack = [(0, state)]
        visited = 0
        while stack:
            node, s = stack.pop()
            visited += 1
            for c, child in self.children[node].items():
                t = int(table[s, c])
                if t != DEAD:
                    for tid in self.ends[child]:
                        out[tid] = t
                    stack.append((child, t))
        return out, visited


# --8<-- [start:apply]
def allowed(next_row: np.ndarray, accepting: bool, eos_id: int) -> np.ndarray:
    """The step's mask: tokens that keep the output completable, and <eos> only where the output is complete."""
    mask = next_row >= 0
    mask[eos_id] = accepting
    return mask


def apply(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """What vLLM's bitmask kernel does to a row of logits: -inf wherever the mask is off."""
    return np.where(mask, logits, -np.inf)
# --8<-- [end:apply]


def packed_bytes(vocab_size: int) -> int:
    """Bytes of one mask row packed one bit per token into 32-bit words, vLLM's layout (cdiv(vocab, 32) int32)."""
    return -(-vocab_size // 32) * 4
