"""The verification walk down a token tree (Numba)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def accept_walk(tokens: np.ndarray, parents: np.ndarray, accept: np.ndarray,
                fallback: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Accepted path and new tokens of one step.

    tokens[M], parents[M]: the tree (-1 = x); accept[M]: whether node i is
    accepted should the walk reach its parent; fallback[1 + M]: the token
    that ends the step at x (index 0) or at node i (index 1 + i). Returns
    (path[k] node indices, new[k + 1] tokens).

    Worked example: tokens [4 5 6 7], parents [-1 0 1 0], accept
    [T F T T], fallback [9 8 1 3 2] -> at x, node 0 (token 4) is accepted;
    among 0's children node 1 is not, node 3 (token 7) is; node 3 has no
    children, its fallback 2 ends the step: path [0 3], new [4 7 2].
    """
    size = tokens.shape[0]
    path = np.empty(size, dtype=np.int64)
    new = np.empty(size + 1, dtype=np.int64)
    cur = -1
    k = 0
    while True:
        child = -1
        for node in range(size):
            if parents[node] == cur and accept[node]:
                child = node
                break
        if child < 0:
            new[k] = fallback[cur + 1]
            break
        path[k] = child
        new[k] = tokens[child]
        k += 1
        cur = child
    return path[:k], new[:k + 1]


@njit(cache=True)
def chosen_walk(tokens: np.ndarray, parents: np.ndarray, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``accept_walk`` where a node is accepted when its token is the one chosen at its parent's row
    (the verifier's rule, greedy and sampled alike), in one call: accept[i] = tokens[i] ==
    chosen[parents[i] + 1], and chosen is also the fallback.

    tokens[M], parents[M] (-1 = x), chosen[1 + M] (x's row first). Returns (path[k], new[k + 1]).

    Worked example: tokens [4 5 6 7], parents [-1 0 1 0], chosen [4 7 1 3 2] -> at x (row 0, 4) node
    0 is accepted; at node 0 (row 1, 7) node 3 is, not node 1 (5); node 3 has no children and its
    row says 2: path [0 3], new [4 7 2].
    """
    accept = tokens == chosen[parents + 1]  # [M]: each node's token is the one its parent's row chose
    return accept_walk(tokens, parents, accept, chosen)
