"""ALL acceptance logic: which tree tokens the target model itself would produce.

Greedy: walk the tree from x following the model's argmax; every node whose
token equals its parent's argmax is accepted, then the argmax after the last
accepted node is the bonus token (kept also when the whole branch matched).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def greedy_accept(tokens, parents, root_next, node_next):
    """Accepted path and new tokens for greedy decoding.

    tokens[M], parents[M]: the tree (-1 = x); root_next: argmax at x;
    node_next[M]: argmax at each node. Returns (path[k] node indices,
    new[k + 1] tokens): the path's tokens followed by the bonus token.

    Worked example: tokens [4 5 6 7], parents [-1 0 1 0], root_next 4,
    node_next [7 9 1 3] -> x's argmax 4 = node 0; node 0's argmax 7 = node 3
    (child of 0); node 3's argmax 3 has no child: path [0 3], new [4 7 3].
    """
    size = tokens.shape[0]
    path = np.empty(size, dtype=np.int64)
    new = np.empty(size + 1, dtype=np.int64)
    cur = -1
    want = root_next
    k = 0
    while True:
        new[k] = want
        child = -1
        for node in range(size):
            if parents[node] == cur and tokens[node] == want:
                child = node
                break
        if child < 0:
            break
        path[k] = child
        k += 1
        cur = child
        want = node_next[child]
    return path[:k], new[:k + 1]
