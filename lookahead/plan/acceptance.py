"""Online acceptance estimates per (source class, depth), and how far to trust what a tree promises.

Every tree node carries the class its source gave it (see proposers/base.py)
and its depth. After each verification, a node whose parent was accepted (or
whose parent is x) is a trial; if it was accepted too, a hit. The estimate of
a class at a depth is (hits + strength * above) / (trials + strength): the
chance a token of that kind is accepted once its parent is, where ``above``
is the class's prior at depth 1 and the estimate one level up below it (what
a class learned near the root carries down to the depths it seldom reaches).
Counts are halved when trials pass ``horizon``, so the estimates follow the
text being generated.

The estimates run optimistic: the best-first tree keeps exactly the nodes
whose estimates came out high (a winner's curse), and a path's probability
is a product of per-depth averages. How far off they are depends on how much
a tree promises: on open text a tree promising 0.7 tokens may yield nothing
for many steps in a row while trees promising 8 on a copy yield 8. So the
table also keeps a ``GainCalibration``: per level of promised tokens, the
tokens kept trees yielded over those they promised, over a window of recent
steps. The budget weighs every tree size by what trees promising that much
really yielded lately (``calibrated``, used by budget.py), which is what
keeps a step where nothing pays at the cost of a plain decode step.

The table is kept per regime across generate calls (planner.py), and so is
what each source learns for itself (``state``: e.g. what a draft model's
forwards add, what a window column is worth): a source keeps its learners
in its own slot, keyed by its name, so the table names no source.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.learner import DecayedSlots
from ..kernels.estimates import ESTIMATE_CEILING, ESTIMATE_FLOOR, backoff_estimates, count_tree
from .budget import LEAST_PROMISE

GAIN_LEVELS = np.array([0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0])  # promised extra tokens per tree, calibrated
# apart: a tree promising 0.7 on open text and one promising 8 on a copy are trusted apart
GAIN_PRIOR_TREES = 1.0  # each level starts as if this many trees had yielded what they promised: a fresh level
# is trusted
GAIN_DECAY = 0.98  # weight of the past per step, speculative or not: about the last 50 steps count, so the
# trust follows the text
PRIOR_STRENGTH = 4.0  # trials a class's prior counts as at every depth: a few verified nodes already move it
HORIZON = 400.0  # trials past which a cell's counts are halved, so the estimates follow the text being generated
GAIN_RANGE = (0.1, 1.5)  # a level's trust stays in here: never so low it stops a level for good, nor so high
# that one lucky copy inflates it


class GainCalibration:
    """Tokens trees yielded over tokens they promised, per level of promise (GAIN_LEVELS).

    A tree promising p extra tokens counts at the two levels around p (by
    log distance). Every step decays all levels, so a level that stopped
    speculating because it never paid drifts back to its prior (trust 1.0)
    and is tried again after a few dozen steps: the text may have changed.
    """

    def __init__(self) -> None:
        self.logs = np.log(GAIN_LEVELS)  # [L]
        self.log_list = self.logs.tolist()  # the same, for bisect
        prior = (GAIN_PRIOR_TREES * GAIN_LEVELS).tolist()  # [L] pseudo-tokens on both sides of each ratio
        # yielded / promised [L], stepped once a step in plain floats (core/learner.py DecayedSlots)
        self.ratio = DecayedSlots(prior, prior, GAIN_DECAY)
        self.cached: np.ndarray | None = None  # ``factors`` as they stand (None: a step since)

    def observe(self, promised: float, yielded: float) -> None:
        """One step: its tree promised ``promised`` extra tokens and yielded ``yielded`` (0, 0: no tree)."""
        self.ratio.step(yielded, promised, self._weights(promised) if promised > 0 else [])
        self.cached = None

    def factors(self) -> np.ndarray:
        """[L] yielded / promised per level, with the prior, clipped to GAIN_RANGE (shared: read only)."""
        if self.cached is None:
            low, high = GAIN_RANGE
            self.cached = np.array([min(max(value, low), high) for value in self.ratio.values()])
        return self.cached

    def calibrated(self, promised: np.ndarray) -> np.ndarray:
        """What trees promising ``promised`` [k] extra tokens are expected to yield [k].

        Fresh: [0.5, 3.0] -> [0.5, 3.0]; after many trees promising 0.7 that
        yielded nothing, 0.7 maps to about 0.07 while 8.0 stays near 8.0.
        """
        at = np.log(np.maximum(promised, LEAST_PROMISE))
        return promised * np.interp(at, self.logs, self.factors())

    def curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(log levels [L], factors [L]): ``calibrated`` maps p to p * interp(log p, logs, factors)."""
        return self.logs, self.factors()

    def _weights(self, promised: float) -> list[tuple[int, float]]:
        """The levels ``promised`` counts at, with their interpolation weights (all on an end level beyond
        it): [(level, weight), ...], the levels not named weighing 0."""
        logs = self.log_list
        at = min(max(math.log(promised), logs[0]), logs[-1])  # (scalars: math and lists, not numpy)
        hi = bisect.bisect_left(logs, at)
        if hi == 0 or logs[hi] == at:
            return [(hi, 1.0)]
        upper = (at - logs[hi - 1]) / (logs[hi] - logs[hi - 1])
        return [(hi - 1, 1.0 - upper), (hi, upper)]


class AcceptanceStats:
    """hits / trials [C, D] for all classes of all sources (source i owns a block of rows)."""

    def __init__(self, priors: list[np.ndarray], depth: int = 32, strength: float = PRIOR_STRENGTH,
                 horizon: float = HORIZON):
        sizes = [int(p.shape[0]) for p in priors]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)  # [S + 1]
        self.bounds = self.offsets.tolist()  # the same as ints: what a step reads (no numpy scalar each time)
        self.prior = np.concatenate([np.zeros(0), *priors]).astype(np.float64)  # [C] (C = 0: no sources)
        self.seen_trials = np.zeros((self.prior.shape[0], depth))  # [C, D] verified nodes whose parent held
        self.seen_hits = np.zeros((self.prior.shape[0], depth))  # [C, D] those accepted too
        self.weight = np.full((self.prior.shape[0], depth), float(strength))  # [C, D] pseudo-trials of the prior
        self.horizon = horizon
        self.gain = GainCalibration()  # what trees yield against what they promise
        self.states: dict[str, Any] = {}  # what each source learns for itself, by source name (``state``)
        self.latest: np.ndarray | None = None  # ``estimates`` as the counts now give them (None: counted since;
        # shared by every caller, none of which writes to it)

    @property
    def depth(self) -> int:
        return int(self.seen_trials.shape[1])

    @property
    def trials(self) -> np.ndarray:
        """[C, D] trials counted, the prior's pseudo-trials included."""
        return self.seen_trials + self.weight

    def estimates(self) -> np.ndarray:
        """[C, D] acceptance chance given the parent was accepted, in (0, 1).

        Depth 1 starts from the class's prior; every deeper depth starts from the
        estimate one level up (learned, where nodes were verified there), so what a
        class showed near the root carries down to depths the budget seldom reaches:
        without it, a deep estimate would sit at the prior, keep the budget from going
        that deep, and so never learn. Prior .5, strength 4, depth 1 seen 2 of 2 ->
        (2 + 4 * .5) / (2 + 4) = .67 there, and (0 + 4 * .67) / (0 + 4) = .67 at depth 2.
        """
        if self.latest is None:  # (kept until the counts change: steps without a tree change nothing)
            self.latest = backoff_estimates(self.prior, self.seen_hits, self.seen_trials, self.weight, ESTIMATE_FLOOR,
                                            ESTIMATE_CEILING)
        return self.latest

    def block(self, source: int, estimates: np.ndarray) -> np.ndarray:
        """Rows of ``estimates`` that belong to source number ``source``."""
        return estimates[self.bounds[source]:self.bounds[source + 1]]

    def update(self, classes: np.ndarray, depths: np.ndarray, parents: np.ndarray, path: np.ndarray) -> None:
        """Count the trials and hits of one verified tree (classes, depths, parents [M]; path [k])."""
        if classes.shape[0] == 0:
            return
        count_tree(classes, depths, parents, path, self.seen_trials, self.seen_hits, self.weight, self.horizon)
        self.latest = None

    def observe_gain(self, predicted: float, realised: int) -> None:
        """A step whose tree promised ``predicted`` tokens beyond the bonus one added ``realised``
        (0, 0 for a step without a tree: the calibration's window moves on)."""
        self.gain.observe(predicted, realised)

    def calibrated(self, promised: np.ndarray) -> np.ndarray:
        """Expected extra tokens of trees promising ``promised`` [k] (GainCalibration.calibrated)."""
        return self.gain.calibrated(promised)

    def calibration(self) -> tuple[np.ndarray, np.ndarray]:
        """The calibration as the budget's kernel reads it (``GainCalibration.curve``), as it stands now."""
        return self.gain.curve()

    def state(self, name: str, factory: Callable[[], Any]) -> Any:
        """What the source called ``name`` learns for itself in this regime, made by ``factory()``
        the first time it is asked for (kept as long as the table: across generate calls)."""
        if name not in self.states:
            self.states[name] = factory()
        return self.states[name]
