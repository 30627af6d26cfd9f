"""benchmarks/closed_loop.py: the server's loop in one process, lookahead against speculation off."""

from __future__ import annotations

import numpy as np

from conftest import tiny_model
from lookahead.benchmarks.closed_loop import by_kind, compare
from lookahead.plan.choice import StepChooser

MOTIF = [5, 9, 13, 17, 21]
PROMPTS = [np.array(p) for p in (MOTIF * 3, [7, 8, 9], [40, 41] + MOTIF * 2, [11, 12], MOTIF + [2, 4] * 3)]


def test_both_loops_give_every_request_the_same_tokens():
    decide = StepChooser.decide
    report = compare(tiny_model("llama"), None, [PROMPTS, PROMPTS[::-1]], PROMPTS[:2], clients=3, new=12)
    assert StepChooser.decide is decide, "the forecast log put the chooser back"
    assert [r["order"] for r in report["rounds"]] == [["lookahead", "plain"], ["plain", "lookahead"]]
    for entry in report["rounds"]:
        assert entry["same_tokens"] == len(PROMPTS)
        plain, spec = entry["plain"], entry["lookahead"]
        assert plain["new_tokens"] == spec["new_tokens"] > 0
        assert plain["steps"] == sum(k["steps"] for k in plain["by_kind"].values())
        # speculation off: one token a sequence every step (its chooser has no curve: "fixed")
        assert all(k["tokens"] == int(key.split(" x")[1]) for key, k in plain["by_kind"].items()), plain["by_kind"]
        assert entry["ratio"] == spec["tokens_per_s"] / plain["tokens_per_s"]


def test_by_kind_groups_steps_by_kind_and_sequences():
    steps = [("plain", 2, 2, 0.02, 2.0, 0.025, 0.001), ("tree", 2, 5, 0.04, 6.0, 0.03, 0.002),
             ("plain", 2, 2, 0.03, 2.0, 0.025, 0.002)]
    table = by_kind(steps)
    assert list(table) == ["plain x2", "tree x2"]
    assert table["plain x2"]["steps"] == 2 and np.isclose(table["plain x2"]["ms"], 25.0)
    assert np.isclose(table["plain x2"]["host_ms"], 1.5)
    assert np.isclose(table["plain x2"]["tokens_per_s"], 4 / 0.05) and np.isclose(table["tree x2"]["forecast_ms"], 30.0)
