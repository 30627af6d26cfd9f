"""Numba kernels of the n-gram pool: first token -> its most recent continuations.

The pool is five arrays (see ``new_pool``): a dense ``slot_of[V]`` from token to
row, and per row up to C continuations of length L = N - 1 with LRU stamps.
Rows are evicted least-recently-used when all R are taken; continuations of a
row likewise. Inserting a continuation already present only refreshes it.

Worked example (N = 3, so L = 2; C = 2)::

    insert 5 -> (7, 9)      row of 5: [(7, 9)]
    insert 5 -> (8, 1)      row of 5: [(7, 9), (8, 1)]
    insert 5 -> (7, 9)      refreshed: lookup order (7, 9), (8, 1)
    insert 5 -> (4, 4)      full: (8, 1), the oldest, is replaced
    lookup(5, 4)            -> [[4, 4], [7, 9]]
    lookup(6, 4)            -> empty [0, 2] array
"""

from __future__ import annotations

import numpy as np
from numba import njit


def new_pool(vocab: int, rows: int, capacity: int,
             length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fresh pool arrays: slot_of[V], key_of[R], grams[R, C, L], gram_stamp[R, C], row_stamp[R], clock[2]."""
    slot_of = np.full(vocab, -1, dtype=np.int64)  # [V]
    key_of = np.full(rows, -1, dtype=np.int64)  # [R]
    grams = np.zeros((rows, capacity, length), dtype=np.int64)  # [R, C, L]
    gram_stamp = np.zeros((rows, capacity), dtype=np.int64)  # [R, C], 0 = empty
    row_stamp = np.zeros(rows, dtype=np.int64)  # [R]
    clock = np.zeros(2, dtype=np.int64)  # [time, rows used]
    return slot_of, key_of, grams, gram_stamp, row_stamp, clock


@njit(cache=True)
def _row_for(key: int, slot_of: np.ndarray, key_of: np.ndarray, gram_stamp: np.ndarray, row_stamp: np.ndarray,
             clock: np.ndarray):
    """Row of key, allocating (or evicting the least recently used row) when absent."""
    row = slot_of[key]
    if row >= 0:
        return row
    if clock[1] < key_of.shape[0]:
        row = clock[1]
        clock[1] += 1
    else:
        row = np.argmin(row_stamp)
        slot_of[key_of[row]] = -1
        gram_stamp[row, :] = 0
    slot_of[key] = row
    key_of[row] = key
    return row


@njit(cache=True)
def pool_insert(key: int, cont: np.ndarray, slot_of: np.ndarray, key_of: np.ndarray, grams: np.ndarray,
                gram_stamp: np.ndarray, row_stamp: np.ndarray, clock: np.ndarray) -> None:
    """Insert continuation cont[L] under first token key (de-duplicated, LRU)."""
    if key < 0 or key >= slot_of.shape[0]:
        return
    clock[0] += 1
    row = _row_for(key, slot_of, key_of, gram_stamp, row_stamp, clock)
    row_stamp[row] = clock[0]
    length = grams.shape[2]
    for c in range(grams.shape[1]):
        if gram_stamp[row, c] == 0:
            continue
        same = True
        for j in range(length):
            if grams[row, c, j] != cont[j]:
                same = False
                break
        if same:
            gram_stamp[row, c] = clock[0]
            return
    oldest = np.argmin(gram_stamp[row])
    grams[row, oldest, :] = cont
    gram_stamp[row, oldest] = clock[0]


@njit(cache=True)
def pool_insert_grams(full: np.ndarray, slot_of: np.ndarray, key_of: np.ndarray, grams: np.ndarray,
                      gram_stamp: np.ndarray, row_stamp: np.ndarray, clock: np.ndarray) -> None:
    """Insert every row of full[M, N] as key full[m, 0] -> full[m, 1:]."""
    for m in range(full.shape[0]):
        pool_insert(full[m, 0], full[m, 1:], slot_of, key_of, grams, gram_stamp, row_stamp, clock)


@njit(cache=True)
def pool_insert_sequence(seq: np.ndarray, start: int, stop: int, slot_of: np.ndarray, key_of: np.ndarray,
                         grams: np.ndarray, gram_stamp: np.ndarray, row_stamp: np.ndarray, clock: np.ndarray) -> None:
    """Insert the n-grams seq[i : i + N] that lie inside seq[:stop] for i >= start."""
    n = grams.shape[2] + 1
    for i in range(max(start, 0), stop - n + 1):
        pool_insert(seq[i], seq[i + 1:i + n], slot_of, key_of, grams, gram_stamp, row_stamp, clock)


@njit(cache=True)
def pool_lookup(key: int, limit: int, slot_of: np.ndarray, grams: np.ndarray, gram_stamp: np.ndarray) -> np.ndarray:
    """Up to limit continuations [k, L] of key, most recently used first."""
    length = grams.shape[2]
    if key < 0 or key >= slot_of.shape[0] or slot_of[key] < 0 or limit <= 0:
        return np.zeros((0, length), dtype=np.int64)
    row = slot_of[key]
    order = np.argsort(-gram_stamp[row])
    count = 0
    for c in range(order.shape[0]):
        if gram_stamp[row, order[c]] > 0:
            count += 1
    count = min(count, limit)
    out = np.empty((count, length), dtype=np.int64)
    for i in range(count):
        out[i, :] = grams[row, order[i], :]
    return out
