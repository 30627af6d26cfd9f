"""Numba kernels (pure @njit functions) and their one-time warm-up."""

from __future__ import annotations

import numpy as np

from .match import match_continuations
from .pool import new_pool, pool_insert_grams, pool_insert_sequence, pool_lookup
from .trie import ancestor_mask, build_trie


def warmup() -> None:
    """Compile (or load from numba's on-disk cache) every kernel on tiny arrays."""
    seq = np.array([1, 2, 3, 1, 2], dtype=np.int64)
    match_continuations(seq, 5, 1, 2, 2, 2)
    pool = new_pool(8, 4, 2, 2)
    pool_insert_sequence(seq, 0, 5, *pool)
    pool_insert_grams(np.array([[1, 2, 3]], dtype=np.int64), *pool)
    pool_lookup(1, 2, pool[0], pool[2], pool[3])
    tokens, parents, _ = build_trie(np.array([[1, 2]], dtype=np.int64), np.array([2], dtype=np.int64), 4)
    ancestor_mask(parents)
    from ..verify import greedy_accept

    greedy_accept(tokens, parents, 1, np.array([2, 3], dtype=np.int64))
