"""Numba kernels of token recycling: grow a tree from what the model ranked highest after a
token (and after a pair of tokens), remembered from earlier forwards.

``adj[V, R]`` holds, for every token, the R tokens the model ranked highest
right after it the last time it was seen (-1 = never seen); ``conf[V, R]``
the confidence bucket (0 .. B-1) the model gave each. The pair table does the
same for the last two tokens: ``pair_keys[S, 2]`` the (previous, token) pair
a slot holds (-1 = empty; slot = ``pair_slot``, a newer pair overwrites an
older one), ``pair_adj[S, R]`` and ``pair_conf[S, R]`` its successors. The
pair's list is more specific (after "the" the model's choice depends on what
came before it), the single token's is seen more often; a node offers both,
the token's own successors that the pair's list already holds skipped.

From x (whose previous token is ``x_prev``, -1: none) the tree is grown
best-first: the next child added is the one with the highest path
probability. A token's successor of rank r and bucket b at depth d is of
class r * B + b and scores est[r * B + b, d - 1]; a pair's successor is of
class R * B + r * B + b.

Worked example (B = 1, R = 2, no pairs): adj[1] = [2, 3], adj[2] = [4, 5],
adj[3] = [-1, -1], adj[4] = adj[5] = [-1, -1]; est = [[.8, .5], [.3, .2],
[.9, .9], [.1, .1]] (class, depth - 1); x = 1, max_nodes 3 -> node 0 = 2
(p .8), node 1 = 4 (p .4, child of 0), node 2 = 3 (p .3): tokens [2 4 3],
parents [-1 0 -1], depths [1 2 1], classes [0 0 1]. As candidate paths (one
per leaf): [[2 4] [3 0]], lens [2 1]. With the pair (1, 2) remembered as
followed by [5, -1] (a pair's rank 0: class 2, est .9), node 1 is 5 (p .72)
and node 2 is 4 (p .4): tokens [2 5 4], classes [0 2 0].
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def pair_slot(prev: int, token: int, slots: int) -> int:
    """The pair table's slot of (prev, token) among ``slots`` (a prime, so every bit counts).

    pair_slot(3, 7, 11) = (3 * 1000003 + 7) % 11 = 8.
    """
    return (prev * 1000003 + token) % slots


@njit(cache=True)
def pair_learn(prev: np.ndarray, tokens: np.ndarray, top: np.ndarray, buckets: np.ndarray, pair_keys: np.ndarray,
               pair_adj: np.ndarray, pair_conf: np.ndarray) -> None:
    """Row i carried tokens[i] after prev[i] (-1: unknown, skipped); the model's top-R there were
    top[i, :R] with confidence buckets[i, :R]: remember them for the pair (the newest wins a slot)."""
    for i in range(tokens.shape[0]):
        if prev[i] >= 0 and tokens[i] >= 0:
            _remember_pair(prev[i], tokens[i], top[i], buckets[i], pair_keys, pair_adj, pair_conf)


@njit(cache=True)
def _remember_pair(prev: int, token: int, successors: np.ndarray, confidence: np.ndarray, pair_keys: np.ndarray,
                   pair_adj: np.ndarray, pair_conf: np.ndarray) -> None:
    """(prev, token)'s slot takes its top-R ``successors`` [R] and their ``confidence`` [R] (the newest
    pair wins a slot)."""
    s = pair_slot(prev, token, pair_keys.shape[0])
    pair_keys[s, 0] = prev
    pair_keys[s, 1] = token
    for r in range(pair_adj.shape[1]):
        pair_adj[s, r] = successors[r]
        pair_conf[s, r] = confidence[r]


@njit(cache=True)
def window_previous(rows: np.ndarray, width: int) -> np.ndarray:
    """[R] the row holding the token each of ``rows`` [R] follows in the text it sees, in a window
    of ``width`` columns (rows level-major: row l * width + i is level l, column i): level l >= 1
    follows the level before in its column, level 0 the column before; -1 for x (row 0).

    width 3, N 4 (kept rows [0 6 7 8]) -> [-1 3 4 5]; N 2 (kept rows [0 1 2]) -> [-1 0 1].
    """
    span = max(width, 1)
    out = np.empty(rows.shape[0], dtype=np.int64)
    for i in range(rows.shape[0]):
        level, column = rows[i] // span, rows[i] % span
        out[i] = -1 if level == 0 and column == 0 else (rows[i] - width if level >= 1 else rows[i] - 1)
    return out


@njit(cache=True)
def previous_tokens(lead_rows: np.ndarray, width: int, step_tokens: np.ndarray, parents: np.ndarray,
                    tree_tokens: np.ndarray, x: int, before_x: int) -> np.ndarray:
    """[K] the token before each kept row's token in the text that row sees: for the window rows kept
    first (``lead_rows`` [L], x's row 0 among them; ``window_previous``) the step token of the row they
    follow (``before_x``, x's predecessor, for x), then for each tree node [M] its parent's token (x at
    depth 1, parent -1). K = L + M.

    lead rows [0], width 0, step tokens [9 4 6], parents [-1 0], tree tokens [4 6], x 9, before x 2
    -> [2 9 4].
    """
    lead = lead_rows.shape[0]
    out = np.empty(lead + parents.shape[0], dtype=np.int64)
    before = window_previous(lead_rows, width)
    for i in range(lead):
        out[i] = step_tokens[before[i]] if before[i] >= 0 else before_x
    for m in range(parents.shape[0]):
        out[lead + m] = tree_tokens[parents[m]] if parents[m] >= 0 else x
    return out


@njit(cache=True)
def table_learn(tokens: np.ndarray, prev: np.ndarray, top: np.ndarray, buckets: np.ndarray, bucket_column: int,
                bucket_count: int, successors: np.ndarray, confidence: np.ndarray, pair_keys: np.ndarray,
                pair_adj: np.ndarray, pair_conf: np.ndarray) -> None:
    """Row i of a forward carried tokens[i] after prev[i] (-1: unknown); the model's top-R there (R: the
    table's width) were top[i, :R], with confidence buckets[i, bucket_column:bucket_column + R] (clipped to
    0 .. bucket_count - 1; ``bucket_column`` R and ``buckets`` top itself read the staged [K, 2R] layout).
    The token's successors [V, R] and confidence are overwritten (a later row of the same token wins),
    and so are the pair's (``pair_learn``; none when the table holds no pairs). Tokens outside
    0 .. V - 1 are skipped.

    tokens [5], prev [-1], top [[7 8]], buckets [[9 0]], 3 buckets -> successors[5] = [7 8],
    confidence[5] = [2 0], no pair learnt.
    """
    vocab, width = successors.shape
    slots = pair_keys.shape[0]
    for i in range(tokens.shape[0]):
        token = tokens[i]
        if token < 0 or token >= vocab:
            continue
        for r in range(width):
            successors[token, r] = top[i, r]
            confidence[token, r] = min(max(buckets[i, bucket_column + r], 0), bucket_count - 1)
        if prev[i] >= 0 and slots > 0:
            _remember_pair(prev[i], token, top[i], confidence[token], pair_keys, pair_adj, pair_conf)


@njit(cache=True)
def _offers(adj: np.ndarray, conf: np.ndarray, pair_keys: np.ndarray, pair_adj: np.ndarray, pair_conf: np.ndarray,
            buckets: int, prev: int, token: int, depth: int, est: np.ndarray, out_tok: np.ndarray, out_cls: np.ndarray,
            out_score: np.ndarray):
    """Fill the successors a node (token after prev, at depth ``depth``) offers, best estimate
    first: the pair's, then the token's own that the pair's list lacks. Returns how many."""
    width = adj.shape[1]
    last = est.shape[1] - 1
    col = min(depth, last)
    n = 0
    if prev >= 0 and pair_keys.shape[0] > 0:
        s = pair_slot(prev, token, pair_keys.shape[0])
        if pair_keys[s, 0] == prev and pair_keys[s, 1] == token:
            for r in range(width):
                if pair_adj[s, r] < 0:
                    continue
                out_tok[n] = pair_adj[s, r]
                out_cls[n] = width * buckets + r * buckets + pair_conf[s, r]
                n += 1
    paired = n
    if 0 <= token < adj.shape[0]:
        for r in range(width):
            t = adj[token, r]
            if t < 0:
                continue
            dup = False
            for k in range(paired):
                if out_tok[k] == t:
                    dup = True
                    break
            if dup:
                continue
            out_tok[n] = t
            out_cls[n] = r * buckets + conf[token, r]
            n += 1
    for k in range(n):
        out_score[k] = est[out_cls[k], col]
    for k in range(1, n):  # insertion sort by falling estimate (stable: pair's first on ties)
        j = k
        while j > 0 and out_score[j] > out_score[j - 1]:
            out_score[j], out_score[j - 1] = out_score[j - 1], out_score[j]
            out_tok[j], out_tok[j - 1] = out_tok[j - 1], out_tok[j]
            out_cls[j], out_cls[j - 1] = out_cls[j - 1], out_cls[j]
            j -= 1
    return n


@njit(cache=True)
def grow_recycled_tree(adj: np.ndarray, conf: np.ndarray, pair_keys: np.ndarray, pair_adj: np.ndarray,
                       pair_conf: np.ndarray, buckets: int, x_prev: int, x: int, est: np.ndarray,
                       max_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Best-first tree under x (after x_prev) from the token and pair tables;
    (tokens, parents, depths, classes) of M <= max_nodes nodes."""
    offer = 2 * adj.shape[1]
    tokens = np.empty(max_nodes + 1, dtype=np.int64)  # slot 0 is x
    parents = np.empty(max_nodes + 1, dtype=np.int64)
    depths = np.empty(max_nodes + 1, dtype=np.int64)
    classes = np.empty(max_nodes + 1, dtype=np.int64)
    prob = np.empty(max_nodes + 1, dtype=np.float64)
    offered = np.empty(max_nodes + 1, dtype=np.int64)
    off_tok = np.empty((max_nodes + 1, offer), dtype=np.int64)
    off_cls = np.empty((max_nodes + 1, offer), dtype=np.int64)
    off_score = np.empty((max_nodes + 1, offer), dtype=np.float64)
    next_rank = np.zeros(max_nodes + 1, dtype=np.int64)
    tokens[0], parents[0], depths[0], classes[0], prob[0] = x, -1, 0, 0, 1.0
    offered[0] = _offers(adj, conf, pair_keys, pair_adj, pair_conf, buckets, x_prev, x, 0, est,
                         off_tok[0], off_cls[0], off_score[0])
    m = 1
    while m <= max_nodes:
        best, best_score = -1, -1.0
        for node in range(m):
            r = next_rank[node]
            if r >= offered[node]:
                continue
            score = prob[node] * off_score[node, r]
            if score > best_score:
                best, best_score = node, score
        if best < 0:
            break
        r = next_rank[best]
        next_rank[best] = r + 1
        tokens[m] = off_tok[best, r]
        parents[m] = best
        depths[m] = depths[best] + 1
        classes[m] = off_cls[best, r]
        prob[m] = best_score
        offered[m] = _offers(adj, conf, pair_keys, pair_adj, pair_conf, buckets, tokens[best], tokens[m],
                             depths[m], est, off_tok[m], off_cls[m], off_score[m])
        m += 1
    return tokens[1:m], parents[1:m] - 1, depths[1:m], classes[1:m]


@njit(cache=True)
def tree_paths(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray,
               labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


@njit(cache=True)
def recycled_paths(adj: np.ndarray, conf: np.ndarray, pair_keys: np.ndarray, pair_adj: np.ndarray,
                   pair_conf: np.ndarray, buckets: int, x_prev: int, x: int, est: np.ndarray,
                   max_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``tree_paths`` of ``grow_recycled_tree`` (one kernel call a step): the recycled tree under x as
    candidate rows (cands [G, L], lens [G], classes [G, L]); G = 0 where the tables know nothing of x."""
    tokens, parents, depths, classes = grow_recycled_tree(adj, conf, pair_keys, pair_adj, pair_conf, buckets, x_prev,
                                                          x, est, max_nodes)
    return tree_paths(tokens, parents, depths, classes)
