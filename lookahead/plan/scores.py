"""Online acceptance estimates per (source class, depth), and the step budget.

Every tree node carries the class its source gave it (see proposers/base.py)
and its depth. After each verification, a node whose parent was accepted (or
whose parent is x) is a trial; if it was accepted too, a hit. The estimate of
a class at a depth is (hits + prior) / (trials + strength): the chance a
token of that kind is accepted once its parent is. Counts are halved when
trials pass ``horizon``, so the estimates follow the text being generated.

The estimates run optimistic: the best-first tree keeps exactly the nodes
whose estimates came out high (a winner's curse), and a path's probability
is a product of per-depth averages. How far off they are depends on how much
a tree promises: on open text a tree promising 0.7 tokens may yield nothing
for many steps in a row while trees promising 8 on a copy yield 8. So the
table also keeps a ``GainCalibration``: per level of promised tokens, the
tokens kept trees yielded over those they promised, over a window of recent
steps. The budget weighs every tree size by what trees promising that much
really yielded lately (``calibrated``), which is what keeps a step where
nothing pays at the cost of a plain decode step.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..cost import CostModel

GAIN_LEVELS = np.array([0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0])  # promised extra tokens per tree, calibrated apart
GAIN_PRIOR_TREES = 1.0  # each level starts as if this many trees had yielded what they promised
GAIN_DECAY = 0.98  # weight of the past per step, speculative or not (about the last 50 steps count)
GAIN_RANGE = (0.1, 1.5)
WINDOW_PRIOR = (1.0, 20.0)  # (tokens, column-steps): a window column starts worth 0.05 tokens a step
DRAFT_BANDS = np.array([0.5, 0.8])  # edges of the free trie's depth-1 coverage: a draft's worth is learned per band
DRAFT_PRIORS = np.array([0.6, 0.4, 0.2])  # tokens one draft forward is first assumed to add, per band
DRAFT_DECAY = 0.95  # weight of the past per step, drafted or not (about the last 20 steps count)


class GainCalibration:
    """Tokens trees yielded over tokens they promised, per level of promise (GAIN_LEVELS).

    A tree promising p extra tokens counts at the two levels around p (by
    log distance). Every step decays all levels, so a level that stopped
    speculating because it never paid drifts back to its prior (trust 1.0)
    and is tried again after a few dozen steps: the text may have changed.
    """

    def __init__(self) -> None:
        self.logs = np.log(GAIN_LEVELS)  # [L]
        self.prior = GAIN_PRIOR_TREES * GAIN_LEVELS  # [L] pseudo-tokens on both sides of each ratio
        self.promised = np.zeros(GAIN_LEVELS.shape[0])  # [L] decayed sums
        self.yielded = np.zeros(GAIN_LEVELS.shape[0])  # [L]

    def observe(self, promised: float, yielded: float) -> None:
        """One step: its tree promised ``promised`` extra tokens and yielded ``yielded`` (0, 0: no tree)."""
        self.promised *= GAIN_DECAY
        self.yielded *= GAIN_DECAY
        if promised <= 0:
            return
        weights = self._weights(promised)  # [L]
        self.promised += weights * promised
        self.yielded += weights * yielded

    def factors(self) -> np.ndarray:
        """[L] yielded / promised per level, with the prior, clipped to GAIN_RANGE."""
        return np.clip((self.yielded + self.prior) / (self.promised + self.prior), *GAIN_RANGE)

    def calibrated(self, promised: np.ndarray) -> np.ndarray:
        """What trees promising ``promised`` [k] extra tokens are expected to yield [k].

        Fresh: [0.5, 3.0] -> [0.5, 3.0]; after many trees promising 0.7 that
        yielded nothing, 0.7 maps to about 0.07 while 8.0 stays near 8.0.
        """
        at = np.log(np.maximum(promised, 1e-9))
        return promised * np.interp(at, self.logs, self.factors())

    def _weights(self, promised: float) -> np.ndarray:
        """[L] interpolation weights of ``promised`` on the levels (all on an end level beyond it)."""
        at = float(np.clip(np.log(promised), self.logs[0], self.logs[-1]))
        hi = int(np.searchsorted(self.logs, at, side="left"))
        weights = np.zeros(self.logs.shape[0])
        if hi == 0 or self.logs[hi] == at:
            weights[hi] = 1.0
            return weights
        upper = (at - self.logs[hi - 1]) / (self.logs[hi] - self.logs[hi - 1])
        weights[hi - 1], weights[hi] = 1.0 - upper, upper
        return weights


class DraftWorth:
    """Tokens a draft model added that the free sources' trie did not hold, per plain target
    step its forwards took, learned apart per band of that trie's depth-1 coverage (DRAFT_BANDS).

    Measured, not modelled: after a step the draft drafted for, the accepted
    path minus its longest prefix the free trie held is what the draft
    alone added (a chain that repeats the free trie's first tokens and runs
    on past them counts only what lies past them), and what it cost is the
    draft's measured seconds over a one-row target step (a catch-up's rows
    beyond one aside: the draft proposer pays those once, where the steps
    still to come win them back) plus what the target's step cost beyond the
    free sources' plan (its extra rows, priced by the cost curve: on a CPU a
    step of 8 rows can cost two of one row). Drafting raises
    a step's tokens per second exactly when this rate beats the plain step's
    (tokens over cost in plain steps). Every step decays every band, so a
    band where drafting stopped because it did not pay drifts back to its
    prior (half of it within about 60 silent steps) and is tried again.
    """

    def __init__(self) -> None:
        self.tokens = np.zeros(DRAFT_PRIORS.shape[0])  # [B] decayed sums
        self.cost = np.zeros(DRAFT_PRIORS.shape[0])  # [B] in plain target steps

    @staticmethod
    def band(covered: float) -> int:
        """The band of a depth-1 coverage: 0.3 -> 0, 0.6 -> 1, 0.9 -> 2."""
        return int(np.searchsorted(DRAFT_BANDS, covered, side="right"))

    def observe(self, covered: float, cost: float, tokens: int) -> None:
        """One step at depth-1 coverage ``covered``: the draft's forwards took ``cost`` plain
        target steps (0: it was silent) and the accepted path held ``tokens`` tokens past the
        free trie's prefix."""
        self.tokens *= DRAFT_DECAY
        self.cost *= DRAFT_DECAY
        if cost > 0:
            band = self.band(covered)
            self.tokens[band] += tokens
            self.cost[band] += cost

    def rate(self, covered: float, forward: float) -> float:
        """Tokens per plain step of draft cost expected at depth-1 coverage ``covered``; the
        prior is one forward costing ``forward`` plain steps that added DRAFT_PRIORS[band].

        Fresh, forward 0.4: 1.5 at coverage 0.3; after draft steps there that cost
        10 plain steps and added 1 token in all, (1 + 0.6) / (10 + 0.4) = 0.15.
        """
        band = self.band(covered)
        return float((self.tokens[band] + DRAFT_PRIORS[band]) / (self.cost[band] + max(forward, 1e-9)))


class AcceptanceStats:
    """hits / trials [C, D] for all classes of all sources (source i owns a block of rows)."""

    def __init__(self, priors: list[np.ndarray], depth: int = 32, strength: float = 4.0,
                 horizon: float = 400.0):
        sizes = [int(p.shape[0]) for p in priors]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)  # [S + 1]
        prior = np.concatenate(priors).astype(np.float64)  # [C]
        self.trials = np.full((prior.shape[0], depth), strength)  # [C, D]
        self.hits = np.repeat(prior[:, None] * strength, depth, axis=1)  # [C, D]
        self.horizon = horizon
        self.gain = GainCalibration()  # what trees yield against what they promise
        self.window_tokens = 0.0  # decayed sum of accepted tokens only the window's n-grams proposed ...
        self.window_columns = 0.0  # ... and of the window columns fed (window_value)
        self.draft = DraftWorth()  # what a draft model's forwards add beyond the free sources

    @property
    def depth(self) -> int:
        return int(self.trials.shape[1])

    def estimates(self) -> np.ndarray:
        """[C, D] acceptance chance given the parent was accepted, in (0, 1)."""
        return np.clip(self.hits / self.trials, 1e-4, 0.9999)

    def block(self, source: int, estimates: np.ndarray) -> np.ndarray:
        """Rows of ``estimates`` that belong to source number ``source``."""
        return estimates[self.offsets[source]:self.offsets[source + 1]]

    def update(self, classes: np.ndarray, depths: np.ndarray, parents: np.ndarray, path: np.ndarray) -> None:
        """Count the trials and hits of one verified tree (classes, depths, parents [M]; path [k])."""
        if classes.shape[0] == 0:
            return
        accepted = np.zeros(classes.shape[0], dtype=bool)  # [M]
        accepted[path] = True
        reached = (parents < 0) | accepted[np.maximum(parents, 0)]  # [M]: parent accepted (or x)
        col = np.minimum(depths - 1, self.depth - 1)  # [M]
        np.add.at(self.trials, (classes[reached], col[reached]), 1.0)
        np.add.at(self.hits, (classes[accepted], col[accepted]), 1.0)
        full = self.trials > self.horizon
        if full.any():
            self.trials[full] *= 0.5
            self.hits[full] *= 0.5


    def observe_gain(self, predicted: float, realised: int) -> None:
        """A step whose tree promised ``predicted`` tokens beyond the bonus one added ``realised``
        (0, 0 for a step without a tree: the calibration's window moves on)."""
        self.gain.observe(predicted, realised)

    def calibrated(self, promised: np.ndarray) -> np.ndarray:
        """Expected extra tokens of trees promising ``promised`` [k] (GainCalibration.calibrated)."""
        return self.gain.calibrated(promised)

    def observe_window(self, columns: int, tokens: int) -> None:
        """A step fed ``columns`` window columns, and ``tokens`` accepted tokens came from the
        window's n-grams alone (nodes of the window source's classes: no earlier source had them)."""
        self.window_tokens = GAIN_DECAY * self.window_tokens + tokens
        self.window_columns = GAIN_DECAY * self.window_columns + columns

    def window_value(self) -> float:
        """Tokens one window column fed for one step is worth (later, through its n-grams).

        A ratio of decayed sums with the prior WINDOW_PRIOR: the window's n-grams
        pay off steps after the columns that made them, so the value is what
        they added lately per column fed lately, not per step.
        """
        tokens, columns = WINDOW_PRIOR
        return (self.window_tokens + tokens) / (self.window_columns + columns)


Calibrate = Callable[[np.ndarray], np.ndarray]


def expected_gains(probs: np.ndarray, limit: int, calibrate: Calibrate | None) -> np.ndarray:
    """[limit + 1] expected tokens of a step keeping the first k = 0..limit nodes: the bonus
    token plus the kept path probabilities, as ``calibrate`` maps what they promise."""
    promised = np.concatenate([[0.0], np.cumsum(probs[:limit])])  # [limit + 1]
    if calibrate is None:
        return 1.0 + promised
    # Keeping more nodes never yields less: levels calibrated apart must not say otherwise.
    return 1.0 + np.maximum.accumulate(calibrate(promised))


def choose_step(probs: list[np.ndarray], window_rows: np.ndarray, window_gain: np.ndarray,
                cost: CostModel | None, cap: int, spent: float = 0.0,
                calibrate: Calibrate | None = None) -> tuple[int, int]:
    """(window option o, tree nodes k) of the step with the most expected tokens per second.

    probs[b] [M_b]: sequence b's path probabilities in best-first order (one
    array for a single sequence). Keeping the first k nodes promises
    1 + sum(probs[b][:k]) tokens (the bonus token is always produced);
    ``calibrate`` says what such a promise yields (``AcceptanceStats.calibrated``;
    None: what it promises). A batch uses one k for every row (a batched step
    costs what its widest row costs; a row with fewer than k nodes keeps all).
    ``spent`` seconds were already spent on this step's candidates (a draft's
    forwards): part of every option's step time.
    Window option o puts window_rows[o] rows before each tree (x included)
    and adds window_gain[o] expected tokens per sequence (what its n-grams
    are worth later, ``AcceptanceStats.window_value``); option 0 must be x
    alone with no gain: option 0 with k = 0 is a plain decode step. Without
    a cost model (a fixed budget): the last (widest) option and min(M, cap) nodes.

    probs [[.9, .1]], rows [1, 3], gains [0, .5], a step costing 1 + 0.1 per row past the
    first -> (1, 1): (1 + .9 + .5) / 1.3 = 1.85 beats 1.9 / 1.1 = 1.73 and 1 / 1.
    """
    limit = min(max((int(p.shape[0]) for p in probs), default=0), cap)
    options = window_rows.shape[0]
    if cost is None:
        return options - 1, limit
    gains = np.zeros(limit + 1)  # [k + 1] summed over the sequences
    for row in probs:
        own = expected_gains(row, limit, calibrate)  # [min(M_b, limit) + 1]
        gains += np.concatenate([own, np.full(limit + 1 - own.shape[0], own[-1])])
    tokens = gains[None, :] + len(probs) * window_gain[:, None]  # [O, k + 1]
    seconds = cost.step(window_rows[:, None] + np.arange(limit + 1)[None, :]) + spent  # [O, k + 1]
    best = int(np.argmax(tokens / seconds))  # flat index into [O, k + 1]; ties go to (0, 0), a plain step
    return best // (limit + 1), best % (limit + 1)
