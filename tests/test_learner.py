"""DecayedRatio, the learner under the gain calibration, the window column's gain and the draft's efficiency,
on tiny hand-computed numbers."""

from __future__ import annotations

import numpy as np
import pytest

from lookahead.core.learner import DecayedRatio


def test_fresh_learner_is_its_prior():
    ratio = DecayedRatio(1.0, 4.0, 0.5)
    assert ratio.value() == 0.25
    assert ratio.values().tolist() == [0.25]


def test_every_step_decays_then_adds():
    ratio = DecayedRatio(1.0, 4.0, 0.5)
    ratio.step(2.0, 4.0)  # num 2, den 4
    assert ratio.value() == (2.0 + 1.0) / (4.0 + 4.0)
    ratio.step(1.0, 0.0)  # num 2 * 0.5 + 1 = 2, den 4 * 0.5 = 2
    assert ratio.num.tolist() == [2.0] and ratio.den.tolist() == [2.0]
    assert ratio.value() == (2.0 + 1.0) / (2.0 + 4.0)


def test_a_step_without_evidence_drifts_back_to_the_prior():
    ratio = DecayedRatio(1.0, 4.0, 0.5)
    ratio.step(0.0, 12.0)  # nothing for 12 units: 1 / 16
    assert ratio.value() == 1.0 / 16.0
    for _ in range(3):
        ratio.step()  # den 6, 3, 1.5
    assert ratio.den.tolist() == [1.5] and ratio.value() == 1.0 / 5.5
    for _ in range(200):
        ratio.step()
    assert ratio.value() == pytest.approx(0.25)


def test_slots_take_their_weights_of_a_step():
    """The docstring example: decay 0.5, two slots."""
    ratio = DecayedRatio(0.0, 1.0, 0.5, slots=2)
    ratio.step(4.0, 2.0, np.array([1.0, 0.0]))
    ratio.step(2.0, 2.0, np.array([0.5, 0.5]))
    assert ratio.num.tolist() == [3.0, 1.0] and ratio.den.tolist() == [2.0, 1.0]
    assert ratio.values().tolist() == [1.0, 0.5]
    assert ratio.value(1) == 0.5


def test_per_slot_priors_and_a_prior_given_when_asked():
    ratio = DecayedRatio(np.array([0.6, 0.2]), 0.0, 0.5, slots=2)
    ratio.step(1.0, 3.0, DecayedRatio.one_hot(0, 2))
    assert DecayedRatio.one_hot(0, 2).tolist() == [1.0, 0.0]
    assert ratio.value(0, prior_den=1.0) == pytest.approx(1.6 / 4.0)
    assert ratio.value(1, prior_den=0.4) == pytest.approx(0.5)  # untouched: its prior over 0.4
    assert ratio.values(prior_den=1.0) == pytest.approx([0.4, 0.2])


def test_a_decayed_scalar_is_a_one_slot_decayed_ratio():
    from lookahead.core.learner import DecayedRatio, DecayedScalar

    rng = np.random.default_rng(3)
    scalar, ratio = DecayedScalar(1.0, 20.0, 0.97), DecayedRatio(1.0, 20.0, 0.97)
    for _ in range(200):
        if rng.random() < 0.3:
            scalar.step(), ratio.step()
        else:
            num, den = float(rng.random() * 3), float(rng.random() * 2)
            scalar.step(num, den), ratio.step(num, den)
        assert np.isclose(scalar.value(), ratio.value()) and np.isclose(scalar.value(5.0), ratio.value(prior_den=5.0))
    half = DecayedScalar(0.0, 0.0, 0.5)
    half.step(4, 2), half.step(2, 2)
    assert (half.num, half.den) == (4.0, 3.0)  # the docstring's example


def test_step_slots_is_step_with_weights_zero_elsewhere():
    from lookahead.core.learner import DecayedRatio
    by_slots, by_weights = DecayedRatio(1.0, 2.0, 0.5, 3), DecayedRatio(1.0, 2.0, 0.5, 3)
    by_slots.step_slots(4, 2, [(0, 0.25), (1, 0.75)])
    assert by_slots.num.tolist() == [1.0, 3.0, 0.0] and by_slots.den.tolist() == [0.5, 1.5, 0.0]  # docstring
    by_weights.step(4, 2, np.array([0.25, 0.75, 0.0]))
    for num, den, slots in [(3.0, 1.0, [(2, 1.0)]), (0.5, 2.0, [(1, 0.4), (2, 0.6)])]:
        by_slots.step_slots(num, den, slots)
        weights = np.zeros(3)
        for slot, weight in slots:
            weights[slot] = weight
        by_weights.step(num, den, weights)
    assert np.array_equal(by_slots.values(), by_weights.values())


def test_gain_calibration_counts_a_promise_at_the_two_levels_around_it():
    from lookahead.plan.acceptance import GAIN_LEVELS, GainCalibration
    calibration = GainCalibration()
    assert calibration._weights(2.0) == [(3, 1.0)]  # on a level: that level alone
    assert calibration._weights(100.0) == [(GAIN_LEVELS.shape[0] - 1, 1.0)]  # past the last: the last
    (low, w_low), (high, w_high) = calibration._weights(3.0)  # between 2 and 4, by log distance
    assert (low, high) == (3, 4) and abs(w_high - np.log(1.5) / np.log(2.0)) < 1e-12 and abs(w_low + w_high - 1) < 1e-12


def test_decayed_slots_docstring_example_and_the_values_of_a_decayed_ratio():
    from lookahead.core.learner import DecayedRatio, DecayedSlots
    slots = DecayedSlots([0.0] * 3, [0.0] * 3, 0.5)
    slots.step(4, 2, [(0, 0.25), (1, 0.75)])
    assert slots.num == [1.0, 3.0, 0.0] and slots.den == [0.5, 1.5, 0.0]
    # stepped alike, past the fold-back of its running factor, it keeps DecayedRatio's values
    prior = [1.0, 2.0, 4.0]
    lazy, ratio = DecayedSlots(prior, prior, 0.9), DecayedRatio(prior, prior, 0.9, 3)
    rng = np.random.default_rng(1)
    steps = int(np.log(DecayedSlots.RESCALE) / np.log(0.9)) + 40
    for step in range(steps):
        weights = [] if step % 4 == 0 else [(int(rng.integers(0, 3)), 1.0)]
        num, den = float(rng.integers(0, 3)), 2.0
        lazy.step(num, den, weights)
        if weights:
            ratio.step_slots(num, den, weights)
        else:
            ratio.step()
    assert lazy.scale > 0.9 ** (steps - 1)  # folded back at least once
    assert np.allclose(lazy.values(), ratio.values()) and np.allclose(lazy.num, ratio.num)
