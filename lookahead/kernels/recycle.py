"""Numba kernels of token recycling: grow a tree from a token -> top-R successors table.

``adj[V, R]`` holds, for every token, the R tokens the model ranked highest
right after it the last time it was seen (-1 = never seen). From x the tree
is grown best-first: the next child added is the one with the highest path
probability. ``conf[V, R]`` holds the confidence bucket (0 .. B-1) the model
gave each remembered successor; a child of rank r and bucket b at depth d is
of class r * B + b and scores est[r * B + b, d - 1].

Worked example (B = 1: conf all 0): adj[1] = [2, 3], adj[2] = [4, 5],
adj[3] = [-1, -1], adj[4] = adj[5] = [-1, -1]; est = [[.8, .5], [.3, .2]]
(class, depth - 1); x = 1, max_nodes 3 -> node 0 = 2 (p .8), node 1 = 4
(p .4, child of 0), node 2 = 3 (p .3): tokens [2 4 3], parents [-1 0 -1],
depths [1 2 1], classes [0 0 1]. As candidate paths (one per leaf):
[[2 4] [3 0]], lens [2 1].
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def grow_recycled_tree(adj, conf, buckets, x, est, max_nodes):
    """Best-first tree under x from adj[V, R] and conf[V, R] (``buckets`` B per rank);
    (tokens, parents, depths, classes) of M <= max_nodes nodes."""
    width = adj.shape[1]
    last = est.shape[1] - 1
    tokens = np.empty(max_nodes + 1, dtype=np.int64)  # slot 0 is x
    parents = np.empty(max_nodes + 1, dtype=np.int64)
    depths = np.empty(max_nodes + 1, dtype=np.int64)
    classes = np.empty(max_nodes + 1, dtype=np.int64)
    prob = np.empty(max_nodes + 1, dtype=np.float64)
    next_rank = np.zeros(max_nodes + 1, dtype=np.int64)
    tokens[0], parents[0], depths[0], classes[0], prob[0] = x, -1, 0, 0, 1.0
    m = 1
    while m <= max_nodes:
        best, best_score = -1, -1.0
        for node in range(m):
            r = next_rank[node]
            tok = tokens[node]
            if r >= width or tok < 0 or tok >= adj.shape[0] or adj[tok, r] < 0:
                continue
            score = prob[node] * est[r * buckets + conf[tok, r], min(depths[node], last)]
            if score > best_score:
                best, best_score = node, score
        if best < 0:
            break
        r = next_rank[best]
        next_rank[best] = r + 1
        tokens[m] = adj[tokens[best], r]
        parents[m] = best
        depths[m] = depths[best] + 1
        classes[m] = r * buckets + conf[tokens[best], r]
        prob[m] = best_score
        m += 1
    return tokens[1:m], parents[1:m] - 1, depths[1:m], classes[1:m]


@njit(cache=True)
def tree_paths(tokens, parents, depths, labels):
    """One row per leaf: (cands[G, L], lens[G], labels per token[G, L]) from x to the leaf."""
    size = tokens.shape[0]
    is_parent = np.zeros(size, dtype=np.bool_)
    for node in range(size):
        if parents[node] >= 0:
            is_parent[parents[node]] = True
    leaves = 0
    width = 1
    for node in range(size):
        if not is_parent[node]:
            leaves += 1
        width = max(width, depths[node])
    cands = np.zeros((leaves, width), dtype=np.int64)
    lens = np.zeros(leaves, dtype=np.int64)
    out_labels = np.zeros((leaves, width), dtype=np.int64)
    g = 0
    for node in range(size):
        if is_parent[node]:
            continue
        lens[g] = depths[node]
        cur = node
        while cur >= 0:
            cands[g, depths[cur] - 1] = tokens[cur]
            out_labels[g, depths[cur] - 1] = labels[cur]
            cur = parents[cur]
        g += 1
    return cands, lens, out_labels
