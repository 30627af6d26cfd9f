"""What a draft model's forwards add beyond the free sources, learned per step (the draft's gate)."""

from __future__ import annotations

import numpy as np

from ...core.learner import DecayedRatio

DRAFT_BANDS = np.array([0.5, 0.8])  # edges of the free trie's depth-1 coverage: where the free sources already
# reach far, a draft adds less per forward, so its efficiency is learned per band
DRAFT_PRIORS = np.array([0.6, 0.4, 0.2])  # tokens one draft forward is first assumed to add, per band: less
# where the free trie covers more
DRAFT_DECAY = 0.95  # weight of the past per step, drafted or not: about the last 20 steps count, so a band that
# stopped drafting is tried again soon
LEAST_FORWARD = 1e-9  # the least a draft forward is priced at, in plain steps: a rate never divides by 0


class DraftEfficiency:
    """Tokens a draft model added that the free sources' trie did not hold, per plain target
    step its forwards took, learned apart per band of that trie's depth-1 coverage (DRAFT_BANDS).

    Measured, not modelled: after a step the draft drafted for, the accepted
    path minus its longest prefix the free trie held is what the draft
    alone added (a chain that repeats the free trie's first tokens and runs
    on past them counts only what lies past them), and what it cost is the
    draft's measured seconds over a one-row target step (a catch-up's rows
    beyond one aside: the draft proposer pays those once, where the steps
    still to come win them back) plus what the target's step cost beyond the
    free sources' plan (its extra rows, priced by the cost curve: where rows
    cost, a step of 8 rows can cost two of one row). Drafting raises
    a step's tokens per second exactly when this rate beats the plain step's
    (tokens over cost in plain steps). Every step decays every band, so a
    band where drafting stopped because it did not pay drifts back to its
    prior (half of it within about 60 silent steps) and is tried again.
    """

    def __init__(self) -> None:
        # tokens / cost in plain target steps [B]; the cost's prior is one forward, known when asked (``rate``)
        self.ratio = DecayedRatio(DRAFT_PRIORS, 0.0, DRAFT_DECAY, DRAFT_PRIORS.shape[0])

    @property
    def tokens(self) -> np.ndarray:
        """[B] decayed sums of the tokens drafting steps added."""
        return self.ratio.num

    @property
    def cost(self) -> np.ndarray:
        """[B] decayed sums of what they cost, in plain target steps."""
        return self.ratio.den

    @staticmethod
    def band(covered: float) -> int:
        """The band of a depth-1 coverage: 0.3 -> 0, 0.6 -> 1, 0.9 -> 2."""
        return int(np.searchsorted(DRAFT_BANDS, covered, side="right"))

    def observe(self, covered: float, cost: float, tokens: int) -> None:
        """One step at depth-1 coverage ``covered``: the draft's forwards took ``cost`` plain
        target steps (0: it was silent) and the accepted path held ``tokens`` tokens past the
        free trie's prefix."""
        if cost > 0:
            self.ratio.step(tokens, cost, DecayedRatio.one_hot(self.band(covered), DRAFT_PRIORS.shape[0]))
        else:
            self.ratio.step()

    def rate(self, covered: float, forward: float) -> float:
        """Tokens per plain step of draft cost expected at depth-1 coverage ``covered``; the
        prior is one forward costing ``forward`` plain steps that added DRAFT_PRIORS[band].

        Fresh, forward 0.4: 1.5 at coverage 0.3; after draft steps there that cost
        10 plain steps and added 1 token in all, (1 + 0.6) / (10 + 0.4) = 0.15.
        """
        return self.ratio.value(self.band(covered), prior_den=max(forward, LEAST_FORWARD))
