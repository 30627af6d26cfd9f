"""The acceptance estimates' back-off (plan/acceptance.py) as one pass over the table.

Per class c, depth 1 starts from its prior and every deeper depth from the
estimate one level up: est[c, d] = (hits[c, d] + weight[c, d] * above) /
(trials[c, d] + weight[c, d]), above = prior[c] at d = 0, else est[c, d - 1]
(unclipped); the table returned is clipped to [lo, hi].
"""

from __future__ import annotations

import numpy as np
from numba import njit

ESTIMATE_FLOOR = 1e-4  # the least chance an estimate gives (lo of the caller's clip): no token is ever sure to fail
ESTIMATE_CEILING = 0.9999  # the greatest (hi): no token is ever sure to hold


@njit(cache=True)
def backoff_estimates(prior: np.ndarray, hits: np.ndarray, trials: np.ndarray, weight: np.ndarray, lo: float,
                      hi: float) -> np.ndarray:
    """[C, D] estimates from prior [C] and the seen hits, trials and the prior's weight [C, D].

    Worked example: prior [.5], hits [[2 0]], trials [[2 0]], weight [[4 4]] ->
    depth 1 (2 + 4 * .5) / (2 + 4) = .667, depth 2 (0 + 4 * .667) / (0 + 4) = .667.
    """
    classes, depth = hits.shape
    out = np.empty((classes, depth))
    for c in range(classes):
        above = prior[c]
        for d in range(depth):
            above = (hits[c, d] + weight[c, d] * above) / (trials[c, d] + weight[c, d])
            out[c, d] = min(max(above, lo), hi)
    return out
