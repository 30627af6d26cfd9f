"""Whether speculative steps give what the budget expected of them: a correction learned from the steps that ran.

The budget (budget.py) picks each step's shape by expected tokens per second:
the acceptance estimates say what a tree yields, the cost curve what its rows
cost. Both are estimates, and the step the budget picks is the one whose
estimate looked best, so errors do not cancel: a choice among many noisy
options is the option most overrated (the winner's curse). Where rows are
dear (a batch of sequences on a few CPU cores, every extra row multiplied by
the batch) a small overrating is enough to make speculation slower than plain
steps; the curve's points that speculative steps price are also the ones
steps visit least, so they are refined last.

``SpeculationCheck`` compares outcome to forecast. For steps that verified a
tree: the tokens they gave beyond the bonus tokens against the tokens beyond
them forecast (``extra``), and the seconds they took against the seconds
forecast, over the same ratio of plain steps (``cost_correction``: what the curve's
overall level already absorbs cancels out). The budget scales a speculative
option's extra tokens by ``extra`` and its seconds by ``cost_correction``; a plain
step is priced as forecast. Correcting the two parts apart, not the rate as
a whole, keeps a cheap tree with a small edge (a few rows where rows cost
little) worth taking when its promise is trimmed. Steps that fed the Jacobi
window are not counted: what a window column is worth arrives in later
steps, not in the tokens the step accepted.

Every learner is a ratio of decayed sums (``DecayedRatio``) that decays on
every step; one that stops getting evidence (no tree was verified for a
while, because the correction said so) drifts back to its prior of 1, so
speculation is tried again once the text, the batch or the machine may have
changed.

Worked example: trees
forecast to give 3.35 tokens beyond the 4 bonus tokens in 61 ms gave 2.77 in
77 ms, while plain steps forecast at 39 ms took 36: with enough such steps
extra goes to 0.83 and cost_correction to 1.37 (less the prior's pull), and a tree then needs
(4 + 0.83 * 3.35) / (61 * 1.37) = 81 tokens/s against the plain step's 103
to be taken (the forecast said 120, so it was).
"""

from __future__ import annotations

from ..core.learner import DecayedScalar

DECAY = 0.98  # per step: about the last 50 steps count
PRIOR_STEPS = 4.0  # the prior (ratio 1) weighs as much as this many steps' worth of each sum
EXTRA_RANGE = (0.1, 1.5)  # the corrections never go past these bounds
COST_CORRECTION_RANGE = (0.67, 4.0)


class SpeculationCheck:
    """Outcomes of plain and tree steps against their forecasts: the budget's two corrections."""

    def __init__(self) -> None:
        # Sums are in units of one step: tokens per sequence, seconds over the forecast step's own.
        self.tokens = DecayedScalar(PRIOR_STEPS, PRIOR_STEPS, DECAY)  # trees: extra tokens given / forecast
        self.tree_seconds = DecayedScalar(PRIOR_STEPS, PRIOR_STEPS, DECAY)  # trees: seconds taken / forecast
        self.plain_seconds = DecayedScalar(PRIOR_STEPS, PRIOR_STEPS, DECAY)  # plain steps: the same

    def extra(self) -> float:
        """What a tree's forecast tokens beyond the bonus tokens are multiplied by."""
        return min(max(self.tokens.value(), EXTRA_RANGE[0]), EXTRA_RANGE[1])

    def cost_correction(self) -> float:
        """What a speculative step's forecast seconds are multiplied by."""
        low, high = COST_CORRECTION_RANGE
        return min(max(self.tree_seconds.value() / self.plain_seconds.value(), low), high)

    def observe(self, kind: str, sequences: int, expected: tuple[float, float], taken: tuple[float, float]) -> None:
        """A step of ``sequences`` sequences and of ``kind`` ("plain", "tree", or "window": not counted,
        a step nonetheless) was forecast to give expected = (tokens, seconds) and gave taken = (tokens,
        seconds)."""
        counted = kind != "window" and sequences > 0 and expected[1] > 0.0 and taken[1] > 0.0
        time = (taken[1] / expected[1], 1.0)  # seconds, in forecast steps
        extra = ((taken[0] - sequences) / sequences, (expected[0] - sequences) / sequences)  # per sequence
        tree = counted and kind == "tree" and extra[1] > 0.0
        _feed(self.tokens, extra if tree else None)
        _feed(self.tree_seconds, time if tree else None)
        _feed(self.plain_seconds, time if counted and kind == "plain" else None)


def _feed(learner: DecayedScalar, amounts: tuple[float, float] | None) -> None:
    """One step of ``learner``: (numerator, denominator) added, or (None) only the decay."""
    if amounts is None:
        learner.step()
    else:
        learner.step(*amounts)
