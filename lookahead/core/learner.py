"""The one learner every online estimate of the planner and its sources is built on.

A ``DecayedRatio`` is a ratio of two decayed sums with a prior: every step
both sums are multiplied by ``decay`` (so about the last 1 / (1 - decay)
steps count), then that step's (numerator, denominator) is added, and the
value is (num + prior_num) / (den + prior_den). A learner that stops getting
evidence (its step added nothing) drifts back to its prior: what stopped
paying is tried again once the text may have changed.

It is vectorised over slots (levels of promise, bands of coverage): a step
adds to every slot at once, each with its own weight (0: that slot got
nothing but the decay). ``DecayedScalar`` (one slot) and ``DecayedSlots`` (a
few slots, a step adding to one or two) give the same values in plain floats,
for learners stepped once a decode step, where numpy's per-call cost shows.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


class DecayedRatio:
    """(decayed sum of numerators + prior_num) / (decayed sum of denominators + prior_den), per slot."""

    def __init__(self, prior_num: ArrayLike, prior_den: ArrayLike, decay: float, slots: int = 1):
        """``prior_num``, ``prior_den``: a number, or one per slot [S]."""
        self.decay = decay
        self.prior_num = np.broadcast_to(np.asarray(prior_num, dtype=np.float64), (slots,))  # [S]
        self.prior_den = np.broadcast_to(np.asarray(prior_den, dtype=np.float64), (slots,))  # [S]
        self.num = np.zeros(slots)  # [S] decayed sums
        self.den = np.zeros(slots)  # [S]

    def step(self, num: float = 0.0, den: float = 0.0, weights: np.ndarray | None = None) -> None:
        """One step: decay every slot, then add ``num`` and ``den`` to every slot, each times its
        weight weights[S] (None: 1 for every slot). step() alone only decays.

        decay 0.5, slots 2: step(4, 2, [1, 0]) then step(2, 2, [0.5, 0.5]) -> num [3, 1], den [2, 1].
        """
        self.num *= self.decay
        self.den *= self.decay
        if weights is None:
            self.num += num
            self.den += den
        else:
            self.num += weights * num
            self.den += weights * den

    def step_slots(self, num: float, den: float, slots: list[tuple[int, float]]) -> None:
        """``step`` with weights that are 0 but at a few slots: [(slot, weight), ...] (fewer numpy calls:
        a step's host work pays a fixed cost for each after a forward flushed the CPU's caches).

        decay 0.5, slots 3: step_slots(4, 2, [(0, 0.25), (1, 0.75)]) -> num [1, 3, 0], den [0.5, 1.5, 0].
        """
        self.num *= self.decay
        self.den *= self.decay
        for slot, weight in slots:
            self.num[slot] += weight * num
            self.den[slot] += weight * den

    def values(self, prior_den: float | None = None) -> np.ndarray:
        """[S] (num + prior_num) / (den + prior_den) per slot; ``prior_den`` replaces the
        denominator's prior when given (a prior whose weight is only known when asked)."""
        return (self.num + self.prior_num) / (self.den + (self.prior_den if prior_den is None else prior_den))

    def value(self, slot: int = 0, prior_den: float | None = None) -> float:
        """The value of one slot (``values``)."""
        den = self.prior_den[slot] if prior_den is None else prior_den
        return float((self.num[slot] + self.prior_num[slot]) / (self.den[slot] + den))

    @staticmethod
    def one_hot(slot: int, slots: int) -> np.ndarray:
        """[S] weights that add a step's amounts to ``slot`` alone."""
        weights = np.zeros(slots)
        weights[slot] = 1.0
        return weights


class DecayedScalar:
    """A one-slot ``DecayedRatio`` in plain floats: the same values, a fraction of its cost per step
    (several learn once a step, after a forward has pushed the host's data out of the CPU's caches)."""

    def __init__(self, prior_num: float, prior_den: float, decay: float):
        self.decay = decay
        self.prior_num, self.prior_den = float(prior_num), float(prior_den)
        self.num = 0.0  # decayed sums
        self.den = 0.0

    def step(self, num: float = 0.0, den: float = 0.0) -> None:
        """One step: decay both sums, then add ``num`` and ``den``; step() alone only decays.

        decay 0.5: step(4, 2) then step(2, 2) -> num 4, den 3.
        """
        self.num = self.num * self.decay + num
        self.den = self.den * self.decay + den

    def value(self, prior_den: float | None = None) -> float:
        """(num + prior_num) / (den + prior_den); ``prior_den`` replaces the denominator's prior when given."""
        return (self.num + self.prior_num) / (self.den + (self.prior_den if prior_den is None else prior_den))


class DecayedSlots:
    """``DecayedRatio.step_slots`` and ``values`` in plain floats for a few slots, the decay kept as one
    running factor (``scale``: the sums as stored, times it, are the decayed sums), so a step touches only
    the slots it adds to: for a learner stepped once a step after a forward has pushed the host's data out
    of the CPU's caches, where every numpy call pays a fixed cost. The stored sums are folded back (scale
    1) before the factor underflows. The same values as a ``DecayedRatio`` stepped alike.

    decay 0.5, priors 0, slots 3: step(4, 2, [(0, 0.25), (1, 0.75)]) -> num [1, 3, 0], den [0.5, 1.5, 0].
    """

    RESCALE = 1e-100  # scale below which the stored sums are folded back

    def __init__(self, prior_num: list[float], prior_den: list[float], decay: float):
        self.decay = decay
        self.prior_num, self.prior_den = list(prior_num), list(prior_den)
        self.stored_num = [0.0] * len(self.prior_num)  # the decayed sums over scale
        self.stored_den = [0.0] * len(self.prior_num)
        self.scale = 1.0

    def step(self, num: float, den: float, slots: list[tuple[int, float]]) -> None:
        """Decay every slot, then add ``num`` and ``den`` times each weight to the slots named in ``slots``
        ([(slot, weight), ...]; empty: only the decay)."""
        self.scale *= self.decay
        if self.scale < self.RESCALE:
            self.stored_num = [v * self.scale for v in self.stored_num]
            self.stored_den = [v * self.scale for v in self.stored_den]
            self.scale = 1.0
        for slot, weight in slots:
            self.stored_num[slot] += weight * num / self.scale
            self.stored_den[slot] += weight * den / self.scale

    @property
    def num(self) -> list[float]:
        """The decayed sums of numerators, per slot."""
        return [v * self.scale for v in self.stored_num]

    @property
    def den(self) -> list[float]:
        """The decayed sums of denominators, per slot."""
        return [v * self.scale for v in self.stored_den]

    def values(self) -> list[float]:
        """(num + prior_num) / (den + prior_den) per slot."""
        scale = self.scale
        return [(n * scale + pn) / (d * scale + pd)
                for n, d, pn, pd in zip(self.stored_num, self.stored_den, self.prior_num, self.prior_den)]
