"""DecayedRatio, the learner under the gain calibration, the window's worth and the draft's worth,
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
