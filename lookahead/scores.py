"""Online acceptance estimates per (source class, depth), and the step budget.

Every tree node carries the class its source gave it (see proposers/base.py)
and its depth. After each verification, a node whose parent was accepted (or
whose parent is x) is a trial; if it was accepted too, a hit. The estimate of
a class at a depth is (hits + prior) / (trials + strength): the chance a
token of that kind is accepted once its parent is. Counts are halved when
trials pass ``horizon``, so the estimates follow the text being generated.

The estimates run optimistic as a whole: the best-first tree keeps exactly
the nodes whose estimates came out high (a winner's curse), and a path's
probability is a product of per-depth averages. So the table also tracks the
tokens the kept trees were predicted to yield against the tokens they did
yield, and ``gain_factor`` (realised / predicted, over a decaying window)
scales every path probability before the budget weighs it against the cost.
"""

from __future__ import annotations

import numpy as np

from .costmodel import CostModel

GAIN_PRIOR = 2.0  # pseudo-tokens on both sides of the gain ratio: starts at 1, moves after a few steps
GAIN_DECAY = 0.97  # weight of the past per step (about the last 30 trees count)
GAIN_RANGE = (0.2, 1.5)


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
        self.predicted = GAIN_PRIOR  # decayed sum of the extra tokens the kept trees were predicted to yield
        self.realised = GAIN_PRIOR  # ... and of those they did yield

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
        """A tree predicted to add ``predicted`` tokens beyond the bonus one added ``realised``."""
        self.predicted = GAIN_DECAY * self.predicted + predicted
        self.realised = GAIN_DECAY * self.realised + realised

    def gain_factor(self) -> float:
        """Realised over predicted extra tokens (1.0 until trees were verified), clipped to GAIN_RANGE."""
        return float(np.clip(self.realised / self.predicted, *GAIN_RANGE))


def choose_tree_size(probs: np.ndarray, base_rows: int, cost: CostModel | None, cap: int,
                     spent: float = 0.0) -> int:
    """How many nodes of a best-first order to verify this step.

    probs[M] are the nodes' path probabilities in best-first order, so keeping
    k nodes yields 1 + sum(probs[:k]) tokens on average (the bonus token is
    always produced). With a cost model, k maximises that over the expected
    step time of base_rows + k rows (k = 0 is plain decoding); without one
    (a fixed budget) k is simply min(M, cap). ``spent`` seconds were already
    spent on this step's candidates (a draft's forwards): part of every
    size's step time.
    """
    limit = min(int(probs.shape[0]), cap)
    if cost is None or limit == 0:
        return limit
    gains = 1.0 + np.concatenate([[0.0], np.cumsum(probs[:limit])])  # [limit + 1]
    seconds = cost.step(base_rows + np.arange(limit + 1)) + spent  # [limit + 1]
    return int(np.argmax(gains / seconds))


def choose_batch_width(probs: list[np.ndarray], base_rows: int, cost: CostModel | None, cap: int) -> int:
    """How many tree nodes every row of a batch verifies this step (one width for all).

    A batched step costs what its widest row costs (rows are padded to it), so
    the rows are not sized one by one: probs[b] holds row b's path
    probabilities in best-first order, and k maximises the batch's expected
    tokens, sum over rows of 1 + sum(probs[b][:k]), over the step time of
    base_rows + k rows per sequence. A row with fewer than k nodes keeps all.
    k = 0 is a plain decode step for every row.
    """
    limit = min(max((int(p.shape[0]) for p in probs), default=0), cap)
    if cost is None or limit == 0:
        return limit
    gains = np.full(limit + 1, float(len(probs)))  # [limit + 1]
    for row in probs:
        cum = np.concatenate([[0.0], np.cumsum(row[:limit])])  # [min(M_b, limit) + 1]
        gains += np.concatenate([cum, np.full(limit + 1 - cum.shape[0], cum[-1])])
    seconds = cost.step(base_rows + np.arange(limit + 1))  # [limit + 1]
    return int(np.argmax(gains / seconds))
