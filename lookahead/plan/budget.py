"""The step budget: how many tree nodes (and window columns) a step verifies.

A step keeping the first k nodes of the best-first trie promises 1 + the
sum of their path probabilities (the bonus token is always produced); the
acceptance table's calibration (acceptance.py) says what such a promise
really yields lately. The cost curve (cost/) prices the step's rows, and
the budget keeps the option with the most expected tokens per second.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.arrays import contiguous
from ..cost import CostModel
from ..cost.curve import MIN_SECONDS
from ..kernels.budget import forecast_options

Calibrate = Callable[[np.ndarray], np.ndarray]
Calibration = tuple[np.ndarray, np.ndarray]  # (log promise levels [L], yield / promise there [L]); acceptance.py
NONE = np.zeros(0)  # no calibration: promises yield what they promise
LEAST_PROMISE = 1e-9  # promises are read on a log scale: nothing (0) counts as this, below every level


def expected_gains(probs: np.ndarray, limit: int, calibrate: Calibrate | None) -> np.ndarray:
    """[limit + 1] expected tokens of a step keeping the first k = 0..limit nodes: the bonus
    token plus the kept path probabilities, as ``calibrate`` maps what they promise."""
    promised = np.concatenate([[0.0], np.cumsum(probs[:limit])])  # [limit + 1]
    if calibrate is None:
        return 1.0 + promised
    # Keeping more nodes never yields less: levels calibrated apart must not say otherwise.
    return 1.0 + np.maximum.accumulate(calibrate(promised))


def forecast_step(probs: list[np.ndarray], window_rows: np.ndarray, window_gain: np.ndarray,
                  cost: CostModel | None, cap: int, spent: float = 0.0, calibration: Calibration | None = None,
                  extra: float = 1.0, cost_correction: float = 1.0,
                  share: float = 0.0) -> tuple[int, int, tuple[float, float] | None]:
    """(window option o, tree nodes k) of the step with the most expected tokens per second, and what was
    expected of that step before ``extra`` and ``cost_correction`` corrected it: (tokens its tree yields,
    summed over the sequences, without the window's gain; seconds); None without a cost model.

    probs[b] [M_b]: sequence b's path probabilities in best-first order (one
    array for a single sequence). Keeping the first k nodes promises
    1 + sum(probs[b][:k]) tokens (the bonus token is always produced);
    ``calibration`` says what such a promise yields (``AcceptanceStats.calibration``;
    None: what it promises). A batch uses one k for every row (a batched step
    costs what its widest row costs; a row with fewer than k nodes keeps all).
    ``spent`` seconds were already spent on this step's candidates (a draft's
    forwards): part of every option's step time.
    Window option o puts window_rows[o] rows before each tree (x included)
    and adds window_gain[o] expected tokens per sequence (what the sources
    say its columns add later, ``Planner.column_worth``); option 0 must be x
    alone with no gain: option 0 with k = 0 is a plain decode step. What speculative
    steps really gave against their forecast lately (``SpeculationCheck``; 1: as
    forecast) corrects every option but the plain step: ``extra`` scales the tree's
    tokens beyond the bonus tokens, ``cost_correction`` the step's seconds. Without a cost model
    (a fixed budget): the last (widest) option and min(M, cap) nodes. ``share`` > 0: only options
    where every sequence is expected to decode at ``share`` of a plain step's rate or faster
    (``LookaheadConfig.fair_share``). One kernel call (kernels/budget.py).

    probs [[.9, .1]], rows [1, 3], gains [0, .5], a step costing 1 + 0.1 per row past the
    first -> (o, k) = (1, 1): (1 + .9 + .5) / 1.3 = 1.85 beats 1.9 / 1.1 = 1.73 and 1 / 1. Speculative
    steps costing 2x their forecast -> (0, 0): 2.4 / 2.6 = 0.92 and 1.9 / 2.2 = 0.86 lose to 1.
    """
    limit = min(max((int(p.shape[0]) for p in probs), default=0), cap)
    if cost is None:
        return window_rows.shape[0] - 1, limit, None
    if len(probs) == 1:
        table = contiguous(probs[0][:limit], np.float64)[None]  # [1, k]
    else:
        table = np.zeros((len(probs), limit))  # [A, k]
        for a, row in enumerate(probs):
            table[a, :min(row.shape[0], limit)] = row[:limit]
    lengths = np.array([min(int(p.shape[0]), limit) for p in probs], dtype=np.int64)  # [A]
    logs, factors = calibration if calibration is not None else (NONE, NONE)
    option, size, tokens, seconds = forecast_options(
        table, lengths, contiguous(window_rows), contiguous(window_gain, np.float64), cost.rows,
        cost.seconds, MIN_SECONDS, limit, spent, logs, factors, LEAST_PROMISE, extra, cost_correction, share)
    return int(option), int(size), (float(tokens), float(seconds))
