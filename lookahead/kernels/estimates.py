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


@njit(cache=True)
def count_tree(classes: np.ndarray, depths: np.ndarray, parents: np.ndarray, path: np.ndarray,
               trials: np.ndarray, hits: np.ndarray, weight: np.ndarray, horizon: float) -> None:
    """Count one verified tree into the table [C, D]: a node whose parent was accepted (or is x) is a
    trial of its class at its depth (the last column for deeper ones), an accepted node (``path``) a
    hit too. A cell counted this step whose trials plus prior weight pass ``horizon`` has its trials,
    hits and weight halved, once, so old evidence fades.

    Nodes 0 <- 1 (classes [0 1], depths [1 2], parents [-1 0]), path [0]: trials [0, 0] and [1, 1]
    += 1 (node 1's parent was accepted), hits [0, 0] += 1.
    """
    count = classes.shape[0]
    last = trials.shape[1] - 1
    accepted = np.zeros(count, dtype=np.bool_)
    for i in range(path.shape[0]):
        accepted[path[i]] = True
    reached = np.zeros(count, dtype=np.bool_)
    for m in range(count):
        reached[m] = parents[m] < 0 or accepted[parents[m]]
        if reached[m]:
            col = min(depths[m] - 1, last)
            trials[classes[m], col] += 1.0
            if accepted[m]:
                hits[classes[m], col] += 1.0
    full = np.zeros(count, dtype=np.bool_)
    for m in range(count):  # judged on the counts after the whole tree ...
        if reached[m]:
            col = min(depths[m] - 1, last)
            full[m] = trials[classes[m], col] + weight[classes[m], col] > horizon
    for m in range(count):  # ... and each cell halved once, however many of its nodes passed
        if not full[m]:
            continue
        col = min(depths[m] - 1, last)
        first = True
        for earlier in range(m):
            if full[earlier] and classes[earlier] == classes[m] and min(depths[earlier] - 1, last) == col:
                first = False
                break
        if first:
            trials[classes[m], col] *= 0.5
            hits[classes[m], col] *= 0.5
            weight[classes[m], col] *= 0.5
