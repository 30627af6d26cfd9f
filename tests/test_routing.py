"""Routes: how a forward runs on this CPU (threads, whose linear kernel), the choice per row count,
and its re-check by the steps that run. Hand-written curves and step times; threads read back."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from lookahead.model.routing import (EXPLORE_BUSY, EXPLORE_FIRST, RECHECK, SWITCH_MARGIN, TRY_STEPS, Route, Routing,
                                     candidate_routes, route_mode)
import lookahead.model.fewrows as fewrows

TORCH2, KERNEL2, TORCH1, KERNEL1 = Route(2, "torch"), Route(2, "kernel"), Route(1, "torch"), Route(1, "kernel")
MM2, MM1 = Route(2, "mm"), Route(1, "mm")
ROWS = np.array([1, 4, 16])


def routing() -> Routing:
    """Kernel x2 fastest up to 4 rows, torch x2 at 16; one-thread routes 1.5x slower."""
    seconds = np.array([[0.030, 0.050, 0.060],   # torch x2
                        [0.020, 0.025, 0.070],   # kernel x2
                        [0.045, 0.075, 0.090],   # torch x1
                        [0.028, 0.038, 0.105]])  # kernel x1
    return Routing(ROWS, [TORCH2, KERNEL2, TORCH1, KERNEL1], seconds)


def run(r: Routing, q: int, took) -> Route:
    """One step over q rows through the route r gives, taking took(route) seconds."""
    route = r.route_for(q)
    r.observe(q, took(route))
    return route


def test_onednn_route_is_offered_where_it_applies_and_its_copy_fits():
    from lookahead.model.routing import onednn_applies
    from lookahead.model.fewrows import onednn_available
    cpu = torch.device("cpu")
    assert candidate_routes(2, True, onednn=True) == [TORCH2, KERNEL2, MM2, Route(2, "onednn"),
                                                     TORCH1, KERNEL1, MM1, Route(1, "onednn")]
    assert onednn_applies(cpu, torch.float32, 100, 300) is onednn_available()
    assert not onednn_applies(cpu, torch.float32, 101, 300)  # the packed copy would take over a third
    assert not onednn_applies(cpu, torch.bfloat16, 100, 10 ** 9)
    assert not onednn_applies(torch.device("meta"), torch.float32, 100, 10 ** 9)


def test_candidate_routes():
    assert candidate_routes(2, True) == [TORCH2, KERNEL2, MM2, TORCH1, KERNEL1, MM1]
    assert candidate_routes(1, True) == [TORCH1, KERNEL1, MM1]
    assert candidate_routes(4, False) == [Route(4, "torch"), Route(4, "mm"), TORCH1, MM1]


def test_each_row_count_takes_its_fastest_route():
    r = routing()
    assert [r.route_for(q) for q in (1, 3, 4, 5, 16, 40)] == [KERNEL2, KERNEL2, KERNEL2, TORCH2, TORCH2, TORCH2]
    assert r.seconds[r.choice, np.arange(3)].tolist() == [0.020, 0.025, 0.060]  # the fastest at each size
    assert r.summary() == "1-4 rows kernel x2, 16 rows torch x2"


def test_a_machine_that_gets_busy_moves_to_one_thread_and_back_when_quiet():
    """Another process takes a core: two-thread routes run 3x slower, one-thread ones as measured."""
    r = routing()
    busy = lambda route: r.seconds[r.routes.index(route), 0] * (3.0 if route.threads == 2 else 1.0)
    tried = 2 * TRY_STEPS
    seen = [run(r, 1, busy) for _ in range(1 + tried + 4)]
    assert seen[0] == KERNEL2 and r.rounds == 1  # the first slow step starts a re-check ...
    assert seen[1:1 + tried] == [TORCH2] * TRY_STEPS + [KERNEL1] * TRY_STEPS  # ... the fastest other route of each
    # thread count runs its try ...
    assert seen[1 + tried:] == [KERNEL1] * 4 and r.route_for(1) == KERNEL1  # ... and one thread wins
    quiet = lambda route: r.seconds[r.routes.index(route), 0]
    seen = [run(r, 1, quiet) for _ in range(EXPLORE_FIRST + 4)]
    assert KERNEL2 in seen and r.route_for(1) == KERNEL2  # the runner-up's scheduled try wins it back


def test_a_runner_up_that_keeps_losing_is_tried_ever_less_often():
    r = routing()
    quiet = lambda route: r.seconds[r.routes.index(route), 0]
    seen = [run(r, 1, quiet) for _ in range(8 * EXPLORE_FIRST)]
    tries = [i for i, route in enumerate(seen) if route != KERNEL2]
    assert len(tries) >= 2 * TRY_STEPS and all(seen[i] == KERNEL1 for i in tries)  # the runner-up at 1 row
    starts = [i for i in tries if i - 1 not in tries]
    assert len(starts) * TRY_STEPS == len(tries)  # TRY_STEPS steps a try
    gaps = np.diff(starts)
    assert gaps[0] >= EXPLORE_FIRST and (gaps[1:] >= gaps[:-1]).all() and gaps[-1] > gaps[0]


def test_under_a_lasting_load_the_fast_route_is_still_tried_often():
    r = routing()
    busy = lambda route: r.seconds[r.routes.index(route), 0] * (3.0 if route.threads == 2 else 1.0)
    seen = [run(r, 1, busy) for _ in range(12 * EXPLORE_BUSY)]
    tries = [i for i, route in enumerate(seen) if route == KERNEL2][1:]  # after the first step
    starts = [i for i in tries if i - 1 not in tries]
    assert len(starts) >= 5 and max(np.diff(starts)) <= 2 * (EXPLORE_BUSY + TRY_STEPS)  # every other scheduled try
    assert seen[-1] == KERNEL1


def test_one_unlucky_step_of_a_try_does_not_decide():
    r = routing()
    unlucky = [True]

    def busy(route):
        slow = 3.0 if route.threads == 2 else 1.0
        if route == KERNEL1 and unlucky[0]:  # the first step of its try hit a burst
            unlucky[0], slow = False, 2.0
        return r.seconds[r.routes.index(route), 0] * slow

    seen = [run(r, 1, busy) for _ in range(1 + 3 * TRY_STEPS + 2)]
    assert seen[-2:] == [KERNEL1] * 2  # the try's median, not its unlucky step


def test_an_unlucky_try_is_corrected_by_a_later_one():
    r = routing()
    unlucky = [TRY_STEPS]

    def busy(route):
        slow = 3.0 if route.threads == 2 else 1.0
        if route == KERNEL1 and unlucky[0]:  # its whole try in the re-check hit a burst
            unlucky[0], slow = unlucky[0] - 1, 3.0
        return r.seconds[r.routes.index(route), 0] * slow

    seen = [run(r, 1, busy) for _ in range(1 + 2 * TRY_STEPS + 2)]
    assert seen[1:1 + 2 * TRY_STEPS].count(KERNEL1) == TRY_STEPS and seen[-1] == KERNEL2  # kept on the unlucky try
    seen = [run(r, 1, busy) for _ in range(4 * EXPLORE_BUSY)]
    assert seen[-1] == KERNEL1  # the estimated runner-up's scheduled try won it back


def test_a_route_within_the_margin_does_not_take_over():
    """kernel x1 runs 3% faster than the chosen kernel x2 (a lucky spell): no switch, and no swing back
    and forth; at 20% faster it takes over."""
    for faster, winner in ((1.03, KERNEL2), (1.2, KERNEL1)):
        r = routing()
        now = lambda route: (0.020 if route == KERNEL2 else 0.020 / faster if route == KERNEL1 else 0.1)
        seen = [run(r, 1, now) for _ in range(4 * EXPLORE_FIRST)]
        assert seen[-1] == winner and r.route_for(1) == winner
        assert np.log(faster) > SWITCH_MARGIN or seen.count(KERNEL1) <= 3 * TRY_STEPS  # only its tries


def test_a_route_slow_at_one_row_count_keeps_its_place_at_another():
    """kernel x2 runs twice its measurement at one row (four sequences on two cores, say) and as
    measured at four: one row moves to kernel x1, four rows stay on kernel x2, with steps of both
    sizes interleaved (one level per route would swing both choices with the mix)."""
    r = routing()

    def took(route, q):
        slow = 2.0 if route == KERNEL2 and q == 1 else 1.0
        return r.seconds[r.routes.index(route), 0 if q == 1 else 1] * slow

    seen = {1: [], 4: []}
    for _ in range(40):
        for q in (1, 4):
            route = r.route_for(q)
            r.observe(q, took(route, q))
            seen[q].append(route)
    chosen = lambda q: r.routes[int(r.choice[r._point(q)])]
    assert seen[1][-10:].count(KERNEL1) >= 10 - TRY_STEPS and chosen(1) == KERNEL1  # (a scheduled try may fall
    assert seen[4][-10:].count(KERNEL2) >= 10 - TRY_STEPS and chosen(4) == KERNEL2  # among the last steps)


def test_a_forward_over_more_rows_than_measured_is_not_counted():
    r = routing()
    seen = [run(r, 64, lambda route: 10.0) for _ in range(4)]  # a draft catching up on a whole prompt
    assert seen == [TORCH2] * 4 and r.rounds == 0  # the largest size's route, no re-check ...
    assert not any(r.followed) and not r.level.any() and not any(r.common)  # ... and nothing learned


def test_noise_within_recheck_changes_nothing():
    r = routing()
    rng = np.random.default_rng(0)
    jitter = lambda route: r.seconds[r.routes.index(route), 1] * rng.uniform(1 / np.sqrt(RECHECK), np.sqrt(RECHECK))
    seen = [run(r, 4, jitter) for _ in range(EXPLORE_FIRST - 1)]
    assert seen == [KERNEL2] * (EXPLORE_FIRST - 1) and r.rounds == 0


def test_route_mode_runs_on_fewer_threads_and_puts_torch_and_numba_back():
    import numba

    fewrows.start_numba_threads()  # (numba.get_num_threads() alone starts numba's pool and so sets torch's count)
    threads, numba_threads = torch.get_num_threads(), numba.get_num_threads()
    seen = {}
    with route_mode(KERNEL1, 1, fewrows.FewRowLinear(torch.nn.Linear(2, 2))):
        seen["torch"], seen["numba"] = torch.get_num_threads(), numba.get_num_threads()
    assert seen == {"torch": 1, "numba": 1}
    assert torch.get_num_threads() == threads and numba.get_num_threads() == numba_threads
    with route_mode(Route(threads + 4, "torch"), 1, None):  # never more than torch's
        assert torch.get_num_threads() == threads
    with route_mode(KERNEL1, fewrows.FEW_ROWS_MAX + 1, None):  # too many rows: as torch is set
        assert torch.get_num_threads() == threads
    with pytest.raises(RuntimeError):
        with route_mode(TORCH1, 1, None):
            raise RuntimeError("a forward that fails")
    assert torch.get_num_threads() == threads


THREADS_SCRIPT = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from lookahead import LookaheadConfig, LookaheadGenerator
{setup}
before = torch.get_num_threads()
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
gen = LookaheadGenerator(model, config=LookaheadConfig(cost_cache_dir="", calibration_repeats=1))
built = torch.get_num_threads()
gen.generate(torch.tensor([[1, 2, 3, 1, 2]]), max_new_tokens=8)
print(before, built, torch.get_num_threads())
"""


@pytest.mark.parametrize("setup, env", [("", {"OMP_NUM_THREADS": "1"}), ("torch.set_num_threads(1)", {})],
                         ids=["OMP_NUM_THREADS=1", "set_num_threads(1)"])
def test_the_users_thread_count_survives_construction_and_generate(setup, env):
    """A fresh process: numba's pool starts inside the generator (it used to set torch to 2 threads). (The
    process keeps the user's HOME: its C++ op, native/, is then loaded from the machine's one build, not
    built again, 20 s.)"""
    import os

    out = subprocess.run([sys.executable, "-c", THREADS_SCRIPT.format(setup=setup)], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "1", "1"]


def test_one_stalled_step_of_the_chosen_route_moves_nothing_but_a_lasting_slowdown_does():
    """A step that stalls (8x its route's time: a page fault, the collector) among normal ones keeps
    the route and starts no re-check; a second slow step in a row does."""
    r = routing()
    stalls = {5}
    steps = iter(range(10_000))

    def took(route):
        slow = 8.0 if next(steps) in stalls else 1.0
        return r.seconds[r.routes.index(route), 0] * slow

    seen = [run(r, 1, took) for _ in range(12)]
    assert seen == [KERNEL2] * 12 and r.rounds == 0
    stalls.update({12, 13, 14})  # now a lasting slowdown
    seen = [run(r, 1, took) for _ in range(3)]
    assert seen[:2] == [KERNEL2] * 2 and seen[2] != KERNEL2 and r.rounds == 1  # the second one starts a re-check


def test_a_slow_spell_the_chosen_route_meets_does_not_hand_its_row_count_to_a_route_not_seen_in_it():
    """The whole machine runs 1.4x slower for a while (under RECHECK): kernel x2, chosen at one row,
    meets the spell; then a re-check at four rows ends and the choice is made again everywhere.
    kernel x1 (measured 10% slower at one row, not run since) must not take one row over: the spell
    was the machine's, not kernel x2's."""
    r = Routing(ROWS[:2], [KERNEL2, KERNEL1], np.array([[0.020, 0.025], [0.022, 0.038]]))
    spell = [1.0]
    took = lambda q: lambda route: r.seconds[r.routes.index(route), 0 if q == 1 else 1] * spell[0]
    for _ in range(4):
        for q in (1, 4):
            run(r, q, took(q))
    spell[0] = 1.4
    seen = [run(r, 1, took(1)) for _ in range(6)]
    assert seen == [KERNEL2] * 6 and r.rounds == 0  # under RECHECK: no re-check
    spell[0] = 2.0  # at four rows the machine gets slower still: a re-check there
    while r.rounds == 0:
        run(r, 4, took(4))
    for _ in range(TRY_STEPS):
        run(r, 4, took(4))
    assert r.route_for(1) == KERNEL2 and r.route_for(4) == KERNEL2


def test_a_step_through_a_route_being_tried_says_so():
    """``trying`` marks exactly the steps that ran a route other than the row count's choice (the decode
    loop then leaves them out of the budget's cost curve: they price a route no chosen step runs)."""
    r = routing()
    quiet = lambda route: r.seconds[r.routes.index(route), 0]
    flags = []
    for _ in range(3 * EXPLORE_FIRST):
        route = r.route_for(1)
        flags.append((route != KERNEL2, r.trying))
        r.observe(1, quiet(route))
    assert any(tried for tried, _ in flags), "no route was tried: the test would show nothing"
    assert all(tried == trying for tried, trying in flags)
