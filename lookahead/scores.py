"""Online acceptance estimates per (source class, depth), and the step budget.

Every tree node carries the class its source gave it (see proposers/base.py)
and its depth. After each verification, a node whose parent was accepted (or
whose parent is x) is a trial; if it was accepted too, a hit. The estimate of
a class at a depth is (hits + prior) / (trials + strength): the chance a
token of that kind is accepted once its parent is. Counts are halved when
trials pass ``horizon``, so the estimates follow the text being generated.
"""

from __future__ import annotations

import numpy as np

from .costmodel import CostModel


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


def choose_tree_size(probs: np.ndarray, base_rows: int, cost: CostModel | None, cap: int) -> int:
    """How many nodes of a best-first order to verify this step.

    probs[M] are the nodes' path probabilities in best-first order, so keeping
    k nodes yields 1 + sum(probs[:k]) tokens on average (the bonus token is
    always produced). With a cost model, k maximises that over the expected
    step time of base_rows + k rows (k = 0 is plain decoding); without one
    (a fixed budget) k is simply min(M, cap).
    """
    limit = min(int(probs.shape[0]), cap)
    if cost is None or limit == 0:
        return limit
    gains = 1.0 + np.concatenate([[0.0], np.cumsum(probs[:limit])])  # [limit + 1]
    seconds = cost.step(base_rows + np.arange(limit + 1))  # [limit + 1]
    return int(np.argmax(gains / seconds))
