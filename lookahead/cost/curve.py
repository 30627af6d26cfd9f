"""The curve the budget prices steps by: seconds of one decode step over q rows, refined by the steps that ran.

A curve starts from a measurement (measure.py) or from the disk cache
(store.py). While decoding, every step's time refines it
(``CostModel.observe``): the grid points around its row count learn what
steps there really take, and what they agree on rescales every size, tried
or not. A curve measured under load thus converges to what steps cost; a
curve measured in this process is written back to the cache once
CONFIRM_STEPS real steps have refined it and it looks plausible (a cached
curve is never rewritten by a later process).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..kernels.curve import refine_curve
from ..model.routing import Routing
from .disk import CurveStore
from .measure import implausibility

GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
TRUST_MEASURED = 4.0  # a plausible measured point weighs as much as this many observed steps
TRUST_REPAIRED = 0.25  # ... a point of an implausible (repaired) curve
CONFIRM_STEPS = 64  # steps observed before a curve measured in this process is written back
RATIO_LIMIT = 100.0  # a step counts as at most this factor off the starting curve
MIN_SECONDS = 1e-9  # the least a step is priced at: ratios of steps never divide by zero


def row_grid(max_rows: int) -> tuple[int, ...]:
    """Row counts measured for a step of at most max_rows rows."""
    return tuple(sorted({q for q in GRID if q < max_rows} | {max_rows}))


@dataclass
class CostModel:
    """Seconds of one decode step over q rows: a measured curve, refined by the steps that ran.

    Between grid points the curve is interpolated, past the last one
    extended along its last segment. ``observe`` refines it from the time
    real steps take; ``smoothing`` 0 keeps it as given.
    """

    rows: np.ndarray  # [S] increasing row counts
    seconds: np.ndarray  # [S] seconds of a step over rows[s]: the starting curve, refined in place
    smoothing: float = 0.1  # the least weight of the newest step in a grid point's mean (0: never refine)
    trust: float = TRUST_MEASURED  # how many observed steps a starting point weighs as much as
    store: CurveStore | None = None  # where the refined curve goes once confirmed (measured in this process)
    repaired: bool = False  # the start is a repaired implausible measurement: kept only once steps covered it
    routing: Routing | None = None  # how forwards run on this CPU (model/routing.py), saved beside the curve
    cached: str | None = None  # the file this curve was read from or saved to as it was loaded (None: neither)
    # Kept as measured, dips included (docs/DESIGN.md, "The cost curve").
    start: np.ndarray = field(init=False, repr=False)  # [S] the curve as it began (measured or read)
    seen: np.ndarray = field(init=False, repr=False)  # [S] steps observed at each point (interpolation weight)
    mean: np.ndarray = field(init=False, repr=False)  # [S] running mean of log(taken / start) there
    scale: float = field(init=False, default=1.0)  # what every size is off by (load slows all alike)
    steps: int = field(init=False, default=0)  # steps observed

    def __post_init__(self) -> None:
        self.rows = np.asarray(self.rows, dtype=np.float64)
        self.seconds = np.array(self.seconds, dtype=np.float64)  # own copy: refined in place
        self.start = self.seconds.copy()
        self.seen, self.mean = np.zeros_like(self.seconds), np.zeros_like(self.seconds)

    def step(self, q: np.ndarray | float) -> np.ndarray:
        """Expected seconds of a decode step with q rows (interpolated; linear past the last point)."""
        return np.maximum(_extend(self.rows, self.seconds, q), MIN_SECONDS)

    def observe(self, q: int, seconds: float) -> None:
        """A step over q rows took ``seconds``: refine the curve.

        The (at most two) grid points that interpolate q add log(taken /
        start) to their running means, weighted by their interpolation
        weight; the newest step weighs at least ``smoothing``, so the means
        follow a machine that gets busier or quieter. The curve is then
        start * exp(level + shape), a shrinkage estimate: each point
        believes its own mean in proportion to seen / (trust + seen), and
        what the points agree on (the level) moves every size, tried or
        not, so a curve measured under load is rescaled everywhere and a
        bad point is corrected where steps run. One kernel call
        (kernels/curve.py); no device work. A pass over more rows than the
        curve spans (a draft catching up on a whole prompt) says nothing
        about the steps it prices, and is ignored.
        """
        if self.smoothing <= 0 or q > self.rows[-1]:
            return
        self.steps += 1
        level = refine_curve(self.rows, self.start, self.seen, self.mean, self.seconds, float(q), float(seconds),
                             float(self.smoothing), float(self.trust), self.steps, RATIO_LIMIT)
        self.scale = math.exp(level)
        if self.store is not None and self.steps % CONFIRM_STEPS == 0:
            self.write_back()

    def write_back(self) -> bool:
        """Save the refined curve where it was measured, once, if it looks plausible; whether it was saved.

        A repaired start is a guess wherever no step ran: such a curve is kept
        only once real steps ran at (or around) every grid point.
        """
        if self.store is None or (self.repaired and (self.seen < 1.0).any()) \
                or implausibility(self.rows, self.seconds[None]) is not None:
            return False
        self.store.save(self.seconds.tolist(), route_seconds(self.routing, self.seconds), {"refined_steps": self.steps})
        self.store = None
        return True


def route_seconds(routing: Routing | None, seconds: np.ndarray) -> list[list[float]]:
    """What is saved of the routes: every route's measured curve [R][S] (one route, the curve, without)."""
    return routing.seconds.tolist() if routing is not None else [list(map(float, seconds))]


def flat_curve(curve: CostModel) -> CostModel:
    """A curve where every step costs what ``curve``'s one-row step costs, never refined:
    what the budget does where rows are free (a GPU at batch 1), on any machine."""
    return CostModel(curve.rows.copy(), np.full_like(curve.seconds, float(curve.step(np.array([1.0]))[0])),
                     smoothing=0.0)


def stand_in_curve(curve: CostModel, factor: float) -> CostModel:
    """A curve priced from ``curve`` at ``factor`` times its rows (a batch ``factor`` times as large runs that
    many rows in all), trusted as little as a repaired one, so that the steps that run refine it quickly.

    rows (1, 2, 4), seconds (10, 12, 16) ms, factor 2 -> seconds at rows 2, 4, 8: (12, 16, 24) ms (past the
    last point, along its last segment).
    """
    seconds = curve.step(curve.rows * factor)  # [S]
    return CostModel(curve.rows.copy(), seconds, smoothing=curve.smoothing, trust=TRUST_REPAIRED)


def _extend(rows: np.ndarray, seconds: np.ndarray, q: np.ndarray | float) -> np.ndarray:
    """seconds at q: interpolated between rows, extended along the last segment (never down) past them."""
    q = np.asarray(q, dtype=np.float64)
    inside = np.interp(q, rows, seconds)
    if rows.shape[0] < 2:
        return inside
    slope = max(seconds[-1] - seconds[-2], 0.0) / max(rows[-1] - rows[-2], 1)
    return np.where(q > rows[-1], seconds[-1] + slope * (q - rows[-1]), inside)


