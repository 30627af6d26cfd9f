"""The suffix store: the tokens of a generator's earlier requests, bounded, oldest requests evicted first.

Kernels in kernels/suffix.py (the ring, its index, the look-up). What it
holds is users' text (outputs, and prompts when asked): see README, "Memory
across requests".
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ...kernels.suffix import HEAD, OLDEST, ORDERS, PROB_EDGES, new_store, store_append, store_lookup, store_separate

MATCH_CAP = 32  # longest continuation a look-up returns (the budget keeps what pays)


class SuffixStore:
    """Earlier requests' tokens in a ring of ``capacity`` tokens (separators included), indexed for
    the longest match of a suffix; a request that no longer fits evicts the oldest ones."""

    def __init__(self, capacity: int):
        if capacity < 2:
            raise ValueError(f"a suffix store holds at least 2 tokens, got capacity {capacity}")
        self.capacity = capacity
        self.ring, self.heads, self.chain, self.state = new_store(capacity)
        self.starts: deque[int] = deque()  # absolute position where each held request begins, oldest first

    @property
    def requests(self) -> int:
        """Requests held (whole or, for one longer than the store, its end)."""
        return len(self.starts)

    @property
    def tokens(self) -> int:
        """Tokens held, separators excluded."""
        return int(self.state[HEAD] - self.state[OLDEST]) - self.requests

    @property
    def nbytes(self) -> int:
        """Host memory the store takes."""
        return self.ring.nbytes + self.heads.nbytes + self.chain.nbytes + self.state.nbytes

    def add(self, tokens: np.ndarray) -> None:
        """One request's tokens [n] (a request longer than the store keeps its last capacity - 1)."""
        tokens = np.ascontiguousarray(tokens[-(self.capacity - 1):], dtype=np.int64)
        if tokens.shape[0] == 0:
            return
        need = tokens.shape[0] + 1  # with its separator
        while self.starts and self.state[HEAD] + need - self.state[OLDEST] > self.capacity:
            self.starts.popleft()
            self.state[OLDEST] = self.starts[0] if self.starts else self.state[HEAD]
        if self.state[HEAD] + need - self.state[OLDEST] > self.capacity:
            self.state[OLDEST] = self.state[HEAD]
        self.starts.append(int(self.state[HEAD]))
        store_append(tokens, self.ring, self.heads, self.chain, self.state, ORDERS)
        store_separate(self.ring, self.state)

    def lookup(self, seq: np.ndarray, stop: int, limit: int,
               length: int = MATCH_CAP) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Up to ``limit`` continuations of seq[:stop]: (tokens [G, L], lens [G], classes [G, L], order)
        (kernels/suffix.store_lookup; order -1: no suffix of it occurred)."""
        return store_lookup(seq, stop, self.ring, self.heads, self.chain, self.state, ORDERS, limit, length,
                            PROB_EDGES)

    def held(self) -> list[np.ndarray]:
        """The requests held, oldest first (what a saved file keeps)."""
        ends = list(self.starts)[1:] + [int(self.state[HEAD])]
        out = []
        for start, end in zip(self.starts, ends):
            index = np.arange(start, end - 1) % self.capacity  # the separator left out
            out.append(self.ring[index].astype(np.int64))
        return out
