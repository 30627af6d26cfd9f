"""Numba kernel of the context matcher: continue the current suffix as it went before.

Worked example (seq = [1 2 3 9 1 2 3], min_n 1, max_n 3, length 2, limit 2):
the suffix [1 2 3] (n = 3) occurred at 0, followed by [9 1]: first candidate
[9 1]. Next n = 2: [2 3] at 1, continuation [9 1] again (skipped as a
duplicate); n = 1: [3] at 2, again [9 1]. Result: one candidate [[9 1]], lens
[2], matched [3] (the match cannot extend further back than seq[0]).

``matched`` is the full length of each match, extended backwards past max_n
(up to ``MATCH_CAP`` tokens): long matches are long copies, whose
continuations are accepted far more often.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MATCH_CAP = 64  # longest match length measured


@njit(cache=True)
def _same(seq: np.ndarray, a: int, b: int, n: int):
    """seq[a : a + n] == seq[b : b + n]."""
    for k in range(n):
        if seq[a + k] != seq[b + k]:
            return False
    return True


@njit(cache=True)
def _is_duplicate(out: np.ndarray, lens: np.ndarray, count: int, seq: np.ndarray, start: int, length: int):
    """Whether seq[start : start + length] equals a candidate already in out."""
    for c in range(count):
        if lens[c] != length:
            continue
        same = True
        for k in range(length):
            if out[c, k] != seq[start + k]:
                same = False
                break
        if same:
            return True
    return False


@njit(cache=True)
def _extend_back(seq: np.ndarray, j: int, tail: int, n: int):
    """Length of the match seq[j:j+n] == seq[tail:tail+n] extended to the left (<= MATCH_CAP)."""
    full = n
    while full < MATCH_CAP and j - 1 - (full - n) >= 0 and seq[j - 1 - (full - n)] == seq[tail - 1 - (full - n)]:
        full += 1
    return full


@njit(cache=True)
def match_continuations(seq: np.ndarray, stop: int, min_n: int, max_n: int, length: int,
                        limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Continuations of the suffix of seq[:stop], longest suffix match first.

    Returns (out[limit, length], lens[limit], matched[limit], count): rows
    0..count-1 are the candidates (most recent occurrence first within each
    suffix length), lens their lengths (>= 1), matched the length of the
    suffix match behind each; duplicates are dropped.
    """
    out = np.zeros((max(limit, 0), length), dtype=np.int64)
    lens = np.zeros(max(limit, 0), dtype=np.int64)
    matched = np.zeros(max(limit, 0), dtype=np.int64)
    count = 0
    for n in range(min(max_n, stop - 1), min_n - 1, -1):
        tail = stop - n
        for j in range(tail - 1, -1, -1):
            if count >= limit:
                return out, lens, matched, count
            if not _same(seq, j, tail, n):
                continue
            start = j + n
            got = min(length, stop - start)
            if got <= 0 or _is_duplicate(out, lens, count, seq, start, got):
                continue
            out[count, :got] = seq[start:start + got]
            lens[count] = got
            matched[count] = _extend_back(seq, j, tail, n)
            count += 1
    return out, lens, matched, count
