"""Numba kernels of the token tree: merge scored candidates into a trie, order it
best-first, ancestor masks.

Worked example: candidates [[4 5 6], [4 7 0]] with lens [3, 2], classes
[[0 0 0], [1 1 0]] and estimates est[class, depth - 1] = [[.9 .5 .5], [.8 .6 .6]]
give the nodes tokens [4 5 6 7], parents [-1 0 1 0], depths [1 2 3 2]
(-1 = the root x; the shared first token 4 is one node, labelled with its
best class, 0, and scored as either class holding: 1 - .1 * .2 = .98). Path
probabilities: [.98, .49, .245, .588]; best-first order [0 3 1 2]. Its
ancestor mask (row sees column) is::

    4: 1 . . .
    5: 1 1 . .
    6: 1 1 1 .
    7: 1 . . 1
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def build_scored_trie(cands: np.ndarray, lens: np.ndarray, classes: np.ndarray, est: np.ndarray,
                      max_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge cands[G, L] (row g valid up to lens[g]) into a trie of at most max_nodes.

    classes[G, L] names each token's estimate row: est[C, D] is the chance a
    token of that class at depth d + 1 is accepted once its parent is (depths
    past D use the last column). A node proposed again by a row whose class
    differs from the node's label (different sources, or kinds of match) is
    accepted if either holds: 1 - (1 - a)(1 - b) becomes its chance and the
    better class its label; a row of the label's class adds nothing. Returns
    (tokens[M], parents[M], depths[M], cls[M], prob[M]) where prob is the path
    probability (product of the estimates from x down).
    """
    total = 0
    for g in range(cands.shape[0]):
        total += lens[g]
    size = min(total, max_nodes)
    nodes = np.empty((4, size), dtype=np.int64)
    cond = np.empty(size, dtype=np.float64)
    m = trie_extend(nodes, cond, 0, cands, lens, classes, 0, est, total)
    return nodes[0, :m], nodes[1, :m], nodes[2, :m], nodes[3, :m], trie_probs(nodes[1], cond, m)


@njit(cache=True)
def trie_extend(nodes: np.ndarray, cond: np.ndarray, m: int, cands: np.ndarray, lens: np.ndarray,
                classes: np.ndarray, offset: int, est: np.ndarray, deepest: int) -> int:
    """Merge one source's rows cands[G, L] (valid up to lens[g], no deeper than ``deepest``; labels
    classes[G, L] + offset) into the trie whose first m nodes fill nodes[4, S] (tokens, parents,
    depths, classes) and cond[S] (each node's chance given its parent), as ``build_scored_trie``
    merges them; returns the new node count (at most S: rows are cut where the trie is full).

    Worked example: an empty trie of capacity 4 (S = 4), rows [[4 5]] class 0, then rows [[4 6]] class 1
    (offset 0), est [[.9 .5], [.8 .6]] -> m 2, then m 3: tokens [4 5 6], parents [-1 0 0],
    cond [.98 .5 .6] (the shared 4 is held if either class holds: 1 - .1 * .2).
    """
    size = cond.shape[0]
    last = est.shape[1] - 1
    for g in range(cands.shape[0]):
        cur = -1
        for d in range(min(lens[g], deepest)):
            tok = cands[g, d]
            label = classes[g, d] + offset
            score = est[label, min(d, last)]
            found = -1
            for node in range(m):
                if nodes[1, node] == cur and nodes[0, node] == tok:
                    found = node
                    break
            if found < 0:
                if m >= size:
                    break
                nodes[0, m] = tok
                nodes[1, m] = cur
                nodes[2, m] = d + 1
                nodes[3, m] = label
                cond[m] = score
                found = m
                m += 1
            elif label != nodes[3, found]:
                if score > cond[found]:
                    nodes[3, found] = label
                cond[found] = 1.0 - (1.0 - cond[found]) * (1.0 - score)
            cur = found
    return m


@njit(cache=True)
def trie_probs(parents: np.ndarray, cond: np.ndarray, m: int) -> np.ndarray:
    """[m] path probabilities of the first m nodes (parents first): the product of cond from x down.

    parents [-1 0 0], cond [.98 .5 .6] -> [.98 .49 .588].
    """
    prob = np.empty(m, dtype=np.float64)
    for node in range(m):
        prob[node] = cond[node] * (prob[parents[node]] if parents[node] >= 0 else 1.0)
    return prob


@njit(cache=True)
def best_first_order(parents: np.ndarray, prob: np.ndarray) -> np.ndarray:
    """Node indices by falling path probability, every node after its parent.

    Any prefix of the order is a tree (closed under parents), so the caller
    may keep the first k nodes for any k. Ties go to the lower index.
    """
    size = parents.shape[0]
    order = np.empty(size, dtype=np.int64)
    taken = np.zeros(size, dtype=np.bool_)
    for k in range(size):
        best = -1
        for node in range(size):
            if taken[node] or (parents[node] >= 0 and not taken[parents[node]]):
                continue
            if best < 0 or prob[node] > prob[best]:
                best = node
        order[k] = best
        taken[best] = True
    return order


@njit(cache=True)
def ranked_nodes(parents: np.ndarray, prob: np.ndarray, depths: np.ndarray,
                 deepest: int) -> tuple[np.ndarray, np.ndarray]:
    """(order [K], probs [K]): ``best_first_order`` of the nodes shallower than ``deepest``, and their
    path probabilities (one kernel call where the planner needs both; the nodes kept are still closed
    under parents, ancestors being shallower).

    Worked example: parents [-1 0 0 -1], prob [.9 .3 .5 .6], depths [1 2 2 1], deepest 3 ->
    order [0 3 2 1], probs [.9 .6 .5 .3]; deepest 2 -> order [0 3], probs [.9 .6].
    """
    full = best_first_order(parents, prob)
    order = np.empty(full.shape[0], dtype=np.int64)
    probs = np.empty(full.shape[0], dtype=np.float64)
    k = 0
    for node in full:
        if depths[node] < deepest:
            order[k] = node
            probs[k] = prob[node]
            k += 1
    return order[:k], probs[:k]


@njit(cache=True)
def step_arrays(window_offsets: np.ndarray, window_mask: np.ndarray, window_tokens: np.ndarray, x: int,
                kept: np.ndarray, tree_tokens: np.ndarray, parents: np.ndarray,
                depths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One step's rows [window | tree] in one pass: (offsets [Q], mask [Q, Q], tokens [Q], keep [K]).

    The window's S rows (offsets, mask [S, S]; tokens: window_tokens, x at row 0, which may be empty
    for x alone) then the tree's M nodes at offsets of their depths, each seeing x, itself and its
    ancestors (``layout_mask``); keep: the window's ``kept`` rows, then every tree row.
    Window [0], [[1]], x 7, kept [0]; tree tokens [4 5], parents [-1 0], depths [1 2]
    -> offsets [0 1 2], mask [[1 0 0] [1 1 0] [1 1 1]], tokens [7 4 5], keep [0 1 2].
    """
    start, count = window_offsets.shape[0], parents.shape[0]
    size = start + count
    offsets = np.empty(size, dtype=np.int64)
    tokens = np.empty(size, dtype=np.int64)
    offsets[:start] = window_offsets
    tokens[0] = x
    for i in range(1, min(start, window_tokens.shape[0])):
        tokens[i] = window_tokens[i]
    for i in range(count):
        offsets[start + i] = depths[i]
        tokens[start + i] = tree_tokens[i]
    mask = layout_mask(window_mask, parents)  # [Q, Q]
    keep = np.empty(kept.shape[0] + count, dtype=np.int64)
    keep[:kept.shape[0]] = kept
    for i in range(count):
        keep[kept.shape[0] + i] = start + i
    return offsets, mask, tokens, keep


@njit(cache=True)
def layout_mask(window_mask: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """mask[Q, Q] of a step's rows [window | tree]: the window's rows as ``window_mask`` [S, S] says
    (row 0 is x), each tree node [M] x, itself and its ancestors (Q = S + M).

    window [[1]] (x alone), parents [-1 0] -> [[1 0 0] [1 1 0] [1 1 1]].
    """
    start, size = window_mask.shape[0], window_mask.shape[0] + parents.shape[0]
    mask = np.zeros((size, size), dtype=np.bool_)
    mask[:start, :start] = window_mask
    for i in range(parents.shape[0]):
        mask[start + i, 0] = True
        j = i
        while j >= 0:
            mask[start + i, start + j] = True
            j = parents[j]
    return mask


@njit(cache=True)
def subtree_arrays(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, classes: np.ndarray,
                   nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
    """The nodes [k] of a trie (tokens, parents, depths, classes [M]) as a trie of their own, renumbered
    in their original order (parents first still): (tokens, parents, depths, classes [k], whether the
    nodes were closed under parents; where not, a node whose parent was left out gets parent -1).

    parents [-1 0 0 1], nodes [3 0 1] -> parents [-1 0 1] (nodes 0, 1, 3 renumbered 0, 1, 2), closed.
    """
    keep = np.sort(nodes)
    count = keep.shape[0]
    index = np.full(tokens.shape[0], -1, dtype=np.int64)
    for i in range(count):
        index[keep[i]] = i
    out_tokens, out_parents = np.empty(count, dtype=np.int64), np.empty(count, dtype=np.int64)
    out_depths, out_classes = np.empty(count, dtype=np.int64), np.empty(count, dtype=np.int64)
    closed = True
    for i in range(count):
        node = keep[i]
        out_tokens[i], out_depths[i], out_classes[i] = tokens[node], depths[node], classes[node]
        parent = parents[node]
        out_parents[i] = index[parent] if parent >= 0 else -1
        if parent >= 0 and index[parent] < 0:
            closed = False
    return out_tokens, out_parents, out_depths, out_classes, closed


@njit(cache=True)
def path_tokens(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray) -> np.ndarray:
    """paths[M, D]: row i holds the tokens from x's child down to node i (zeros after depths[i]).

    Example: tokens [4 5 7], parents [-1 0 0], depths [1 2 2] -> [[4 0] [4 5] [4 7]].
    """
    size = tokens.shape[0]
    width = 1
    for node in range(size):
        width = max(width, depths[node])
    paths = np.zeros((size, width), dtype=np.int64)
    for node in range(size):  # parents come before children
        if parents[node] >= 0:
            paths[node, :depths[node] - 1] = paths[parents[node], :depths[node] - 1]
        paths[node, depths[node] - 1] = tokens[node]
    return paths

