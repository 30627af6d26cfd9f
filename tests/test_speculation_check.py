"""The corrections the budget takes from what speculative steps really gave (lookahead/plan/speculation.py),
and how the step chooser feeds them (lookahead/plan/choice.py)."""

from __future__ import annotations

import numpy as np
import pytest

from lookahead.config import LookaheadConfig
from lookahead.cost import CostModel
from lookahead.plan.acceptance import AcceptanceStats
from lookahead.plan.choice import StepChooser
from lookahead.plan.speculation import COST_CORRECTION_RANGE, DECAY, EXTRA_RANGE, PRIOR_STEPS, SpeculationCheck


def after_steps(check: SpeculationCheck, steps: int, *observations) -> SpeculationCheck:
    for _ in range(steps):
        for kind, sequences, expected, taken in observations:
            check.observe(kind, sequences, expected, taken)
    return check


def test_a_fresh_check_trusts_the_forecast():
    check = SpeculationCheck()
    assert (check.extra(), check.cost_correction()) == (1.0, 1.0)


def test_worked_example_four_sequences_on_two_cores():
    """The module docstring's numbers: trees of 3.35 extra tokens in 61 ms gave 2.77 in 77 ms, plain
    steps forecast at 39 ms took 36."""
    check = after_steps(SpeculationCheck(), 400, ("plain", 4, (4.0, 0.039), (4.0, 0.036)),
                    ("tree", 4, (7.35, 0.061), (6.77, 0.077)))
    weight = 1.0 / (1.0 - DECAY ** 2)  # every step decays every learner: one step in two weighs this
    given, forecast = 2.77 / 4, 3.35 / 4  # extra tokens per sequence
    assert check.extra() == pytest.approx((given * weight + PRIOR_STEPS) / (forecast * weight + PRIOR_STEPS))
    assert check.extra() == pytest.approx(0.83, abs=0.03)  # 2.77 / 3.35, less the prior's pull
    assert check.cost_correction() == pytest.approx((77 / 61) / (36 / 39), abs=0.1)  # 1.37, shrunk towards 1 a little


def test_a_busier_machine_slows_plain_and_tree_steps_alike():
    check = after_steps(SpeculationCheck(), 300, ("plain", 1, (1.0, 0.040), (1.0, 0.060)),
                    ("tree", 1, (1.5, 0.045), (1.5, 0.0675)))
    assert check.cost_correction() == pytest.approx(1.0, abs=0.01) and check.extra() == pytest.approx(1.0)


def test_window_steps_do_not_count():
    """A window's columns pay in later steps: the tokens its own step accepted say nothing of them."""
    check = after_steps(SpeculationCheck(), 50, ("window", 1, (3.0, 0.05), (1.0, 0.09)))
    assert (check.extra(), check.cost_correction()) == (1.0, 1.0)


def test_without_evidence_the_corrections_drift_back_to_trust():
    """Speculation shut off by the check is tried again: a check that sees no trees forgets."""
    check = after_steps(SpeculationCheck(), 100, ("tree", 1, (3.0, 0.05), (1.0, 0.10)))
    assert check.extra() < 0.3 and check.cost_correction() > 1.5
    after_steps(check, 400, ("plain", 1, (1.0, 0.04), (1.0, 0.04)))
    assert check.extra() > 0.95 and check.cost_correction() < 1.05


def test_the_corrections_stay_in_their_ranges():
    high = after_steps(SpeculationCheck(), 300, ("tree", 1, (1.1, 1.0), (20.0, 0.01)))
    low = after_steps(SpeculationCheck(), 300, ("tree", 1, (20.0, 0.01), (1.0, 100.0)))
    assert (high.extra(), high.cost_correction()) == (EXTRA_RANGE[1], COST_CORRECTION_RANGE[0])
    assert (low.extra(), low.cost_correction()) == (EXTRA_RANGE[0], COST_CORRECTION_RANGE[1])


def test_the_prior_weighs_a_few_steps():
    check = SpeculationCheck()
    check.observe("tree", 1, (2.0, 0.05), (1.5, 0.05))  # half of the one extra token forecast
    assert check.extra() == pytest.approx((PRIOR_STEPS + 0.5) / (PRIOR_STEPS + 1.0))
    assert check.cost_correction() == 1.0


def chooser(config: LookaheadConfig) -> tuple[StepChooser, CostModel]:
    cost = CostModel(np.array([1.0, 64.0]), np.array([0.040, 0.040 + 63 * 0.004]), smoothing=0.0)
    return StepChooser(config, cost, AcceptanceStats([np.array([0.5])], 4)), cost


def test_chooser_forecasts_the_step_it_shapes_and_learns_its_outcome():
    step_chooser, cost = chooser(LookaheadConfig(window=1, auto_window=False))
    sure = [np.array([0.99, 0.98, 0.97])]
    assert step_chooser.decide(sure, 0.0) == (0, 3)
    assert step_chooser.forecast is not None
    kind, sequences, tokens, seconds = step_chooser.forecast
    assert (kind, sequences) == ("tree", 1) and seconds == pytest.approx(float(cost.step(4)))
    assert 1.0 < tokens <= 4.0
    for _ in range(200):  # the trees keep giving the bonus token alone, where nearly four were forecast
        step_chooser.decide(sure, 0.0)
        step_chooser.record_outcome(1, seconds)
    assert step_chooser.check.extra() < 0.2
    assert step_chooser.decide(sure, 0.0) == (0, 0)  # the plain step, now
    assert step_chooser.forecast is not None and step_chooser.forecast[0] == "plain"
    step_chooser.record_outcome(1, float(cost.step(1)))
    assert step_chooser.forecast is None  # settled once


def test_a_fixed_budget_forecasts_nothing():
    step_chooser = StepChooser(LookaheadConfig(budget="fixed"), None, AcceptanceStats([np.array([0.5])], 4))
    step_chooser.decide([np.array([0.9])], 0.0)
    assert step_chooser.forecast is None
    step_chooser.record_outcome(2, 0.05)  # nothing to learn, nothing raised
    assert step_chooser.check.extra() == 1.0


def test_the_check_can_be_switched_off():
    step_chooser, _ = chooser(LookaheadConfig(check_speculation=False))
    after_steps(step_chooser.check, 100, ("tree", 1, (3.0, 0.05), (1.0, 0.10)))
    assert step_chooser.check.extra() < 0.5 and step_chooser.corrections() == (1.0, 1.0)
    assert LookaheadConfig().check_speculation is True


def test_fair_share_holds_a_batch_to_its_least_accepting_sequence():
    """fair_share 1: a batch where one sequence has nothing to verify takes no step that would decode it
    slower than a plain step; alone, a sequence is never held back (its best is never below plain)."""
    sure, nothing = np.array([0.99, 0.98, 0.97]), np.zeros(0)
    free, _ = chooser(LookaheadConfig(window=1, auto_window=False))
    fair, _ = chooser(LookaheadConfig(window=1, auto_window=False, fair_share=1.0))
    assert free.decide([sure, nothing], 0.0) == (0, 3)
    assert fair.decide([sure, nothing], 0.0) == (0, 0)
    assert fair.decide([sure, sure], 0.0) == (0, 3) and fair.decide([sure], 0.0) == (0, 3)
