"""The step budget's choice (``plan/budget.py``'s ``forecast_step``) in one pass.

Every option (window option o, the first k tree nodes) is priced by the cost curve and valued by
the tokens it is expected to give, summed over the batch's sequences; the option with the most
tokens per second wins. In numpy that is some twenty-five small calls a step, each costing
microseconds on a host whose caches a forward has just flushed; here it is one call.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True)
def curve_seconds(rows: np.ndarray, seconds: np.ndarray, least: float, q: float) -> float:
    """A cost curve (grid ``rows`` [S], ``seconds`` [S]) at q rows: interpolated between the grid points,
    the first point's below them, extended along the last segment (never down) past them; at least
    ``least``. rows [1 4], seconds [2 3]: q 2 -> 2.33, q 7 -> 4.0 (slope 1/3 a row), q 0 -> 2.0."""
    count = rows.shape[0]
    if q <= rows[0]:
        value = seconds[0]
    elif q >= rows[count - 1]:
        value = seconds[count - 1]
        if count >= 2:
            slope = max(seconds[count - 1] - seconds[count - 2], 0.0) / max(rows[count - 1] - rows[count - 2], 1.0)
            value += slope * (q - rows[count - 1])
    else:
        hi = int(np.searchsorted(rows, q))
        lo = hi - 1
        value = seconds[lo] + (q - rows[lo]) * (seconds[hi] - seconds[lo]) / (rows[hi] - rows[lo])
    return max(value, least)


@njit(cache=True)
def forecast_options(probs: np.ndarray, lengths: np.ndarray, window_rows: np.ndarray, window_gain: np.ndarray,
                     rows: np.ndarray, seconds: np.ndarray, least: float, cap: int, spent: float,
                     logs: np.ndarray, factors: np.ndarray, least_promise: float, extra: float,
                     cost_correction: float, share: float = 0.0) -> tuple[int, int, float, float]:
    """(window option o, tree nodes k, the tree's expected tokens summed over the sequences, the step's
    seconds) of the option with the most expected tokens per second.

    probs [A, M]: each sequence's path probabilities best-first (lengths [A] of them valid). Keeping
    the first k nodes promises p = sum(probs[a, :k]) extra tokens, which yield p * f(log p), f the
    calibration's ``factors`` interpolated over ``logs`` (none given: as promised), never less for
    more nodes; plus the bonus token. A batch keeps one k for all (a sequence with fewer nodes
    keeps all). Option o puts window_rows[o] rows before each tree and is worth window_gain[o]
    tokens per sequence. Seconds: the curve (rows, seconds) at window_rows[o] + k, plus ``spent``.
    ``extra`` scales every option's tokens beyond the bonus ones and ``cost_correction`` its seconds, but the
    plain step's (o = 0, k = 0). Ties go to the earlier option (o first, then k).

    ``share`` > 0 (a batch of several sequences): an option is admitted only if every sequence's own
    tokens from it (its bonus token and its tree's, not the window's later worth), per second of the
    step, reach ``share`` times the plain step's rate of one token: a sequence whose candidates are
    seldom accepted then rides in no step so dear that it decodes slower than without speculation
    (share 1.0), however much the others' trees would gain. The plain step is always admitted.

    One sequence, probs [[.9 .1]], window rows [1 3], gains [0 .5], a curve of 1 + 0.1 a row past
    the first -> (1, 1, 1.9, 1.3): (1 + .9 + .5) / 1.3 beats 1.9 / 1.1 and 1 / 1.
    """
    count = probs.shape[0]
    longest = 0
    for a in range(count):
        longest = max(longest, lengths[a])
    limit = min(longest, cap)
    gains = np.zeros(limit + 1)  # [k + 1] summed over the sequences
    lowest = np.full(limit + 1, np.inf)  # [k + 1] the least any one sequence expects
    for a in range(count):
        promised, best = 0.0, 0.0
        for k in range(limit + 1):
            if k > 0 and k <= lengths[a]:
                promised += probs[a, k - 1]
            value = promised
            if logs.shape[0] > 0:
                at = math.log(max(promised, least_promise))
                value = promised * np.interp(at, logs, factors)
            best = value if k == 0 else max(best, value)
            gains[k] += 1.0 + best
            lowest[k] = min(lowest[k], best)
    base = float(count)
    plain = curve_seconds(rows, seconds, least, float(window_rows[0])) + spent
    best_rate, option, size = -1.0, 0, 0
    for o in range(window_rows.shape[0]):
        for k in range(limit + 1):
            taken = curve_seconds(rows, seconds, least, float(window_rows[o] + k)) + spent
            tokens = base + extra * (gains[k] - base) + base * window_gain[o]
            priced = taken if o == 0 and k == 0 else taken * cost_correction
            if share > 0.0 and (o > 0 or k > 0) and (1.0 + extra * lowest[k]) / priced < share / plain:
                continue  # some sequence would decode slower than its share of a plain step's rate
            rate = tokens / priced
            if rate > best_rate:
                best_rate, option, size = rate, o, k
    chosen = curve_seconds(rows, seconds, least, float(window_rows[option] + size)) + spent
    return option, size, gains[size], chosen
