"""Numba kernels (pure @njit functions) and their one-time warm-up."""

from __future__ import annotations

import numpy as np

from .budget import forecast_options
from .curve import refine_curve
from .estimates import ESTIMATE_CEILING, ESTIMATE_FLOOR, backoff_estimates, count_tree
from .linear import WIDE_ROWS, rows_linear
from .match import match_continuations
from .pool import new_pool, pool_insert_grams, pool_insert_sequence, pool_lookup
from .recycle import grow_recycled_tree, pair_learn, previous_tokens, table_learn, tree_paths
from .suffix import ORDERS, PROB_EDGES, new_store, store_append, store_lookup, store_separate
from .topk import top_entries
from .trie import best_first_order, build_scored_trie, layout_mask, path_tokens, subtree_arrays
from .walk import accept_walk


def warmup() -> None:
    """Compile (or load from numba's on-disk cache) every kernel on tiny arrays."""
    seq = np.array([1, 2, 3, 1, 2], dtype=np.int64)
    backoff_estimates(np.full(1, 0.5), np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), ESTIMATE_FLOOR,
                      ESTIMATE_CEILING)
    match_continuations(seq, 5, 1, 2, 2, 2)
    count_tree(np.zeros(2, dtype=np.int64), np.ones(2, dtype=np.int64), np.array([-1, 0], dtype=np.int64),
               np.zeros(1, dtype=np.int64), np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), 8.0)
    forecast_options(np.full((1, 2), 0.5), np.array([2], dtype=np.int64), np.array([1, 3], dtype=np.int64),
                     np.zeros(2), np.array([1.0, 4.0]), np.ones(2), 1e-9, 2, 0.0, np.zeros(1), np.ones(1), 1e-9, 1.0,
                     1.0, 0.0)
    refine_curve(np.array([1.0, 4.0]), np.ones(2), np.zeros(2), np.zeros(2), np.ones(2), 2.0, 1.0, 0.1, 8.0, 1, 100.0)
    pool = new_pool(8, 4, 2, 2)
    pool_insert_sequence(seq, 0, 5, *pool)
    pool_insert_grams(np.array([[1, 2, 3]], dtype=np.int64), *pool)
    pool_lookup(1, 2, pool[0], pool[2], pool[3])
    cands = np.array([[1, 2]], dtype=np.int64)
    tokens, parents, depths, _, prob = build_scored_trie(cands, np.array([2], dtype=np.int64),
                                                         np.zeros((1, 2), dtype=np.int64), np.ones((1, 1)), 4)
    best_first_order(parents, prob)
    shared = np.ones((1, 1), dtype=np.bool_)
    layout_mask(shared, parents)
    shared.flags.writeable = False  # the window's masks are cached read-only (plan/window.py)
    layout_mask(shared, parents)
    subtree_arrays(tokens, parents, depths, np.zeros_like(tokens), np.zeros(1, dtype=np.int64))
    adj = np.array([[1, -1], [0, -1]], dtype=np.int64)
    keys, pair_adj = np.full((3, 2), -1, dtype=np.int64), np.full((3, 2), -1, dtype=np.int64)
    pair_learn(np.array([1], dtype=np.int64), np.array([0], dtype=np.int64), adj[:1], np.zeros_like(adj[:1]),
               keys, pair_adj, np.zeros_like(pair_adj))
    grown = grow_recycled_tree(adj, np.zeros_like(adj), keys, pair_adj, np.zeros_like(pair_adj), 1, 1, 0,
                               np.full((4, 2), 0.5), 3)
    tree_paths(*grown)
    previous_tokens(np.array([0, 2], dtype=np.int64), 2, seq, np.array([-1, 0], dtype=np.int64), seq[:2], 1, -1)
    table_learn(np.array([1, 5], dtype=np.int64), np.array([0, -1], dtype=np.int64), adj, np.zeros_like(adj), 3,
                np.full((4, 2), -1, dtype=np.int64), np.zeros((4, 2), dtype=np.int64), keys, pair_adj,
                np.zeros_like(pair_adj))
    path_tokens(tokens, parents, depths)

    ring, heads, chain, state = new_store(16)
    store_append(seq, ring, heads, chain, state, ORDERS)
    store_separate(ring, state)
    store_lookup(seq, 2, ring, heads, chain, state, ORDERS, 2, 2, PROB_EDGES)
    accept_walk(tokens, parents, np.ones(2, dtype=np.bool_), np.array([2, 3, 4], dtype=np.int64))
    for scores in (np.zeros((1, 3), dtype=np.float32), np.zeros((1, 3))):
        top_entries(scores, 2, np.array([0.5]))
    for rows in (1, WIDE_ROWS):  # both kernels behind rows_linear
        rows_linear(np.ones((2, 2), dtype=np.float32), np.ones((rows, 2), dtype=np.float32))
