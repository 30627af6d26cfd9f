"""One step's refinement of a cost curve (``cost/curve.py``'s ``CostModel.observe``) in one pass.

The curve holds S grid points: their row counts ``rows`` [S], the seconds measured at start
``start`` [S], and per point the weight of the steps seen there ``seen`` [S] and the running mean
of log(taken / start) ``mean`` [S]. A step over q rows that took ``taken`` seconds adds its log
ratio to the (at most two) points that interpolate q, weighted by their interpolation weights
(the newest step weighs at least ``smoothing``); every point then believes its own mean in
proportion shrink = seen / (trust + seen) and takes the rest from the level (what the points
agree on, believed in proportion 1 - exp(-steps / trust)): seconds = start * exp(level +
shrink * (mean - level)). A point that steps have not shown yet (seen < trust) is priced at most
what a larger point they have shown costs: a step over fewer rows costs no more, and a point
priced above that (its start measured in a slow spell, or one stalled step its only evidence)
would never be chosen, so never corrected (a one-row point priced above the two-row one makes every
step take a tree of one node, and the plain step, never taken, keeps its wrong price).

Done in numpy that is some twenty small calls a step, each costing microseconds on a host whose
caches a forward has just flushed; here it is one call.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True)
def refine_curve(rows: np.ndarray, start: np.ndarray, seen: np.ndarray, mean: np.ndarray, seconds: np.ndarray,
                 q: float, taken: float, smoothing: float, trust: float, steps: int, ratio_limit: float) -> float:
    """Add a step over ``q`` rows that took ``taken`` seconds (the ``steps``-th, counting it) to seen and
    mean [S], write the refined curve into seconds [S]; returns the level. q must lie within rows
    (<= rows[-1]); below rows[0] it counts at the first point.

    rows [1 4], start [1 2], nothing seen, q 1, taken 2 (twice the curve), smoothing 0.1, trust 1,
    steps 1, limit 8 -> seen [1 0], mean [log 2, 0], shrink [0.5, 0], level log 2 * (1 - e^-1) =
    0.438, seconds [1 * e^(0.438 + 0.5 (0.693 - 0.438)), 2 * e^0.438] = [1.76, 3.10]. A point seen
    fewer than ``trust`` times is then lowered to any larger point seen that often that costs less:
    rows [1 2], start [5 2], seen [0 9] (mean 0) -> seconds [2 2], not [5 2].
    """
    count = rows.shape[0]
    hi = int(np.searchsorted(rows, q))
    if hi == 0:
        lo, upper = 0, 0.0
    elif hi >= count:
        lo, hi, upper = count - 1, count - 1, 0.0
    else:
        lo = hi - 1
        upper = (q - rows[lo]) / (rows[hi] - rows[lo])
    base = (1.0 - upper) * start[lo] + upper * start[hi]
    ratio = min(max(taken / base, 1.0 / ratio_limit), ratio_limit)
    logged = math.log(ratio)
    for point, weight in ((lo, 1.0 - upper), (hi, upper)):
        if weight > 0.0:
            seen[point] += weight
            rate = max(weight / seen[point], weight * smoothing)
            mean[point] += rate * (logged - mean[point])
    weight_sum = 0.0
    weighted = 0.0
    for s in range(count):
        shrink = seen[s] / (seen[s] + trust)
        weight_sum += shrink
        weighted += shrink * mean[s]
    level = weighted / weight_sum * (1.0 - math.exp(-steps / trust)) if weight_sum > 0.0 else 0.0
    for s in range(count):
        shrink = seen[s] / (seen[s] + trust)
        seconds[s] = start[s] * math.exp(level + shrink * (mean[s] - level))
    cap = np.inf  # the least a larger point that steps have shown (seen >= trust) costs
    for s in range(count - 1, -1, -1):
        if seen[s] < trust and seconds[s] > cap:
            seconds[s] = cap
        if seen[s] >= trust:
            cap = min(cap, seconds[s])
    return level
