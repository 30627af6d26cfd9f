"""Numba kernels of the token tree: merge candidates into a trie, ancestor masks.

Worked example: candidates [[4 5 6], [4 7 0]] with lens [3, 2] give the nodes
tokens [4 5 6 7], parents [-1 0 1 0], depths [1 2 3 2] (-1 = the root x; the
shared first token 4 is one node). Its ancestor mask (row sees column) is::

    4: 1 . . .
    5: 1 1 . .
    6: 1 1 1 .
    7: 1 . . 1
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def build_trie(cands, lens, max_nodes):
    """Merge cands[G, L] (row g valid up to lens[g]) into (tokens[M], parents[M], depths[M])."""
    total = 0
    for g in range(cands.shape[0]):
        total += lens[g]
    size = min(total, max_nodes)
    tokens = np.empty(size, dtype=np.int64)
    parents = np.empty(size, dtype=np.int64)
    depths = np.empty(size, dtype=np.int64)
    m = 0
    for g in range(cands.shape[0]):
        cur = -1
        for d in range(lens[g]):
            tok = cands[g, d]
            found = -1
            for node in range(m):
                if parents[node] == cur and tokens[node] == tok:
                    found = node
                    break
            if found < 0:
                if m >= size:
                    break
                tokens[m] = tok
                parents[m] = cur
                depths[m] = d + 1
                found = m
                m += 1
            cur = found
    return tokens[:m], parents[:m], depths[:m]


@njit(cache=True)
def ancestor_mask(parents):
    """mask[M, M]: node i may attend to node j iff j is i or an ancestor of i."""
    size = parents.shape[0]
    mask = np.zeros((size, size), dtype=np.bool_)
    for i in range(size):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask
