"""Token recycling: the model's own top-R next tokens, remembered per token and
expanded into a tree (kernels in kernels/recycle.py).

Every forward already computes the logits at x, at the window's last level and
at every tree node, rejected ones included. Their top-R tokens are stored as
"what follows token t" (the most recent sighting wins) in an adjacency table
[V, R] that lives as long as the generator, and from x a best-first tree is
grown over it. Classes are the successor ranks 0 .. R-1.
"""

from __future__ import annotations

import numpy as np

from ..kernels.recycle import grow_recycled_tree, tree_paths
from .base import Candidates, no_candidates


def rank_priors(width: int) -> np.ndarray:
    """Assumed acceptance of a rank-r successor before any is measured."""
    return 0.4 / (1.0 + 2.0 * np.arange(width))


class AdjacencyTable:
    """token -> its most recent top-R successors; -1 = not seen yet."""

    def __init__(self, vocab: int, width: int):
        self.successors = np.full((vocab, width), -1, dtype=np.int64)  # [V, R]

    @property
    def width(self) -> int:
        return int(self.successors.shape[1])

    def learn(self, tokens: np.ndarray, top: np.ndarray) -> None:
        """Row i of a forward carried tokens[i]; the model's top-R there were top[i, :R]."""
        ok = (tokens >= 0) & (tokens < self.successors.shape[0])
        self.successors[tokens[ok]] = top[ok, :self.width]


class RecyclingProposer:
    """Proposes a best-first tree of up to ``nodes`` recycled successors of x."""

    name = "recycle"

    def __init__(self, table: AdjacencyTable, nodes: int):
        self.table = table
        self.nodes = nodes
        self.priors = rank_priors(table.width)

    def begin(self, seq: np.ndarray, stop: int) -> None:
        """The table is kept across sequences: nothing to reset."""

    def propose(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray) -> Candidates:
        if limit <= 0 or self.nodes <= 0:
            return no_candidates()
        tokens, parents, depths, ranks = grow_recycled_tree(self.table.successors, int(seq[stop - 1]),
                                                            estimates, self.nodes)
        if tokens.shape[0] == 0:
            return no_candidates()
        return Candidates(*tree_paths(tokens, parents, depths, ranks))

    def observe(self, seq: np.ndarray, start: int, stop: int) -> None:
        """Nothing: the table learns from the forward's logits (AdjacencyTable.learn)."""
