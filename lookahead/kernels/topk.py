"""The top-R entries of every row of a score matrix, and how sure each is: token recycling's read of the logits.

torch's ``topk`` over a vocabulary row costs about the same whatever R is
(a full pass over, e.g., SmolLM2's 49152 floats), and a step reads it for every
kept row: a large share of a step's host time. Here a row is read in blocks of
``BLOCK`` entries: one pass takes each block's maximum (a loop the compiler
vectorizes), the R-th largest block maximum bounds the R-th largest entry
from below, and only the blocks whose maximum reaches that bound (about R of
them) are scanned entry by entry.

A step's many kept rows are read on numba's threads, a row each (``top_entries_rows``: the same array;
recycle.py picks it from SHARED_ROWS rows).

Entries are ranked by value, the earlier index first among equal values. A row
holding NaN (logits where the model failed) still gives R distinct valid
columns, NaN ones possibly among them, as torch's topk ranks NaN first too:
recycling only proposes, it never decides a token.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

BLOCK = 64  # entries per block: its maximum is one vectorized pass


@njit(cache=True)
def _insert(values: np.ndarray, tokens: np.ndarray, count: int, value: float, token: int) -> int:
    """Insert (value, token) into the descending lists values/tokens [R] holding ``count`` entries
    (after any equal ones); the last entry falls off when they are full. Returns the new count."""
    width = values.shape[0]
    at = min(count, width - 1)
    while at > 0 and values[at - 1] < value:
        values[at] = values[at - 1]
        tokens[at] = tokens[at - 1]
        at -= 1
    values[at] = value
    tokens[at] = token
    return min(count + 1, width)


@njit(cache=True, fastmath=True)
def _block_peaks(row: np.ndarray, peaks: np.ndarray) -> None:
    """peaks[b] = the maximum of row [V] over block b (BLOCK entries; the last one may be shorter).
    fastmath lets the loop vectorize; a row holding NaN may get a wrong peak (``top_entries``
    scans every column when too few are found)."""
    vocab = row.shape[0]
    full = vocab // BLOCK
    grid = row[:full * BLOCK].reshape(full, BLOCK)  # [B, BLOCK]: the whole blocks
    for b in range(full):
        peak = grid[b, 0]
        for i in range(1, BLOCK):
            peak = max(peak, grid[b, i])
        peaks[b] = peak
    if full < peaks.shape[0]:  # the last, shorter block
        peak = row[full * BLOCK]
        for v in range(full * BLOCK + 1, vocab):
            peak = max(peak, row[v])
        peaks[full] = peak


@njit(cache=True)
def _row_top(row: np.ndarray, width: int, edges: np.ndarray, out: np.ndarray, peaks: np.ndarray,
             values: np.ndarray, tokens: np.ndarray, best_peaks: np.ndarray, unused: np.ndarray) -> None:
    """One row's part of ``top_entries``: out [2R] = row [V]'s top-``width`` columns and their buckets
    (``width`` <= V, at least 1); peaks [B], values, tokens, best_peaks, unused [R]: scratch."""
    vocab = row.shape[0]
    blocks = peaks.shape[0]
    _block_peaks(row, peaks)
    found = 0
    for b in range(blocks):  # the R largest block maxima: the R-th bounds the R-th entry from below
        if found < width or peaks[b] > best_peaks[width - 1]:
            found = _insert(best_peaks, unused, found, peaks[b], b)
    bound = best_peaks[found - 1]
    count = 0
    for b in range(blocks):
        if not peaks[b] >= bound and bound == bound:  # (a NaN bound: scan every block)
            continue
        for v in range(b * BLOCK, min(b * BLOCK + BLOCK, vocab)):
            value = row[v]
            if count < width or value > values[width - 1]:
                count = _insert(values, tokens, count, value, v)
    if count < width:  # (NaNs kept whole blocks out: every column counts)
        count = 0
        for v in range(vocab):
            if count < width or row[v] > values[width - 1]:
                count = _insert(values, tokens, count, row[v], v)
    total = 0.0
    for i in range(width):
        total += np.exp(values[i] - values[0])
    for i in range(width):
        out[i] = tokens[i]
        share = np.exp(values[i] - values[0]) / total
        bucket = 0
        for edge in edges:
            bucket += share >= edge
        out[width + i] = bucket


@njit(cache=True)
def top_entries(scores: np.ndarray, width: int, edges: np.ndarray) -> np.ndarray:
    """The top-``width`` columns of every row of scores [K, V] (R = min(width, V)) and their
    confidence buckets: int64 [K, 2R], the columns in descending order of score, then each one's
    bucket, how many ``edges`` its probability within the top R reaches (softmax over the R scores).

    scores [[0.0, 3.0, 1.0, 3.0]], width 2, edges [0.25, 0.5] -> [[1 3 2 2]]: columns 1 and 3 (3.0
    each, the earlier first), each with probability 0.5 within the two, which reaches both edges.
    """
    rows, vocab = scores.shape
    width = min(width, vocab)
    out = np.zeros((rows, 2 * width), dtype=np.int64)
    if width == 0:
        return out
    peaks = np.empty((vocab + BLOCK - 1) // BLOCK, dtype=scores.dtype)  # [B] each block's maximum
    values = np.empty(width, dtype=np.float64)  # [R] the row's best so far, descending
    tokens = np.empty(width, dtype=np.int64)
    best_peaks = np.empty(width, dtype=np.float64)
    unused = np.empty(width, dtype=np.int64)
    for r in range(rows):
        _row_top(scores[r], width, edges, out[r], peaks, values, tokens, best_peaks, unused)
    return out


@njit(cache=True, parallel=True)
def top_entries_rows(scores: np.ndarray, width: int, edges: np.ndarray) -> np.ndarray:
    """``top_entries`` with the rows shared among numba's threads (each row read by one thread, with its
    own scratch): the same array, for a step's many kept rows (the threads' start costs more than a row or
    two take). [[0.0, 3.0, 1.0, 3.0]], 2, [0.25, 0.5] -> [[1 3 2 2]], as top_entries."""
    rows, vocab = scores.shape
    width = min(width, vocab)
    out = np.zeros((rows, 2 * width), dtype=np.int64)
    if width == 0:
        return out
    blocks = (vocab + BLOCK - 1) // BLOCK
    for r in prange(rows):
        _row_top(scores[r], width, edges, out[r], np.empty(blocks, dtype=scores.dtype), np.empty(width),
                 np.empty(width, dtype=np.int64), np.empty(width), np.empty(width, dtype=np.int64))
    return out
