"""The cost model (lookahead/cost/): plausibility of a measured curve, measuring passes and retries,
online refinement, the on-disk cache and what a measurement says on stderr. Hand-written arrays and
fake timers (``decode_step_timer`` replaced), plus a tiny random Llama where a real forward is
timed; no test asserts a duration."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import lookahead.cost.measure as measure
import lookahead.cost.store as store
from conftest import tiny_model
from lookahead.model.switches import ForwardSwitches
from lookahead.cost.curve import CONFIRM_STEPS, TRUST_MEASURED, TRUST_REPAIRED, CostModel, row_grid
from lookahead.cost.measure import ATTEMPTS, MIN_PASSES, implausibility, measure_curve, repair, time_passes
from lookahead.cost.store import load_cost_model
from lookahead.model.support import attention_layout

CPU_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
CPU_SECONDS = (0.020, 0.026, 0.027, 0.029, 0.031, 0.034, 0.040, 0.037, 0.047, 0.055)  # 16 rows < 12: a real dip


def cpu_time(q: int) -> float:
    """The CPU curve above at q rows (interpolated), as a fake decode_step_timer's forward."""
    return float(np.interp(q, CPU_ROWS, CPU_SECONDS))


SLOWER = 1.6  # the fake timers' routes other than the kernel on torch's threads


def fake_timer(times):
    """A stand-in for decode_step_timer (patched in store.py, where load_cost_model looks it up): every
    'forward' over q rows through lookahead's kernel on torch's threads takes times(q), through any other
    route SLOWER times that."""
    def time_one(q, route=None):
        fast = route is None or (route.linear == "kernel" and route.threads == torch.get_num_threads())
        return times(q) * (1.0 if fast else SLOWER)

    return lambda model, layout, context, seed=0, batch=1, switches=None, stop=None: \
        None if times is None else time_one


def first_passes(model) -> int:
    """Passes of the first round: one over every route (none with a single route)."""
    return int(len(measure.measured_routes(model, True)) > 1)


# ---------------------------------------------------------------- plausibility
def test_a_real_cpu_curve_with_its_dip_is_plausible():
    assert implausibility(CPU_ROWS, [CPU_SECONDS]) is None
    rng = np.random.default_rng(0)
    passes = np.array(CPU_SECONDS) * rng.uniform(0.85, 1.2, (5, len(CPU_ROWS)))  # [5, S] ordinary noise
    assert implausibility(CPU_ROWS, passes) is None


def test_the_reported_nonsense_curve_is_flagged():
    """1 row 0.32 s, 3-4 rows 4.5 s, 16 rows 0.16 s (measured while another process held a core)."""
    rows = (1, 2, 3, 4, 6, 8, 12, 16)
    nonsense = (0.32, 0.33, 4.5, 4.5, 0.3, 0.3, 0.2, 0.16)
    assert "3 rows took 28.1x as long as 16 rows" in implausibility(rows, [nonsense])
    assert "rows took" in implausibility((1, 3, 4, 16), [(0.32, 4.5, 4.5, 0.16)])
    assert "from 1 to 2 rows the time grew 15.4x" in implausibility((1, 2, 3), [(0.024, 0.37, 0.37)])


def test_passes_that_disagree_are_flagged_but_one_stray_pass_is_forgiven():
    passes = np.tile(CPU_SECONDS, (3, 1))  # [3, S]
    stray = passes.copy()
    stray[1, 2] = 0.5  # one pass hit by a burst at 3 rows: the median ignores it
    assert implausibility(CPU_ROWS, stray) is None
    twice = stray.copy()
    twice[2, 2] = 0.4  # two of three passes: the passes disagree
    assert "passes over 3 rows took from 27 ms to 500 ms" in implausibility(CPU_ROWS, twice)
    assert implausibility((1, 2), [(0.02, 0.0)]) == "a pass took no time"


def test_repair_gives_a_plausible_curve_that_errs_cheap():
    rows = (1, 2, 3, 4, 6, 8, 12, 16)
    nonsense = np.array([0.32, 0.33, 4.5, 4.5, 0.3, 0.3, 0.2, 0.16])
    fixed = repair(rows, nonsense)
    assert implausibility(rows, [fixed]) is None
    assert (fixed <= nonsense).all() and fixed[-1] == nonsense[-1]
    jump = repair((1, 2, 3), [0.024, 0.37, 0.37])  # cheap at 1 row, dear after: capped growth
    assert implausibility((1, 2, 3), [jump]) is None and jump[0] == 0.024
    assert repair(CPU_ROWS, CPU_SECONDS)[6] == CPU_SECONDS[7]  # (a plausible curve is never repaired)


# ---------------------------------------------------------------- measuring
def test_passes_alternate_and_stop_once_three_agree():
    calls = []

    def steady(q):
        calls.append(q)
        return cpu_time(q)

    times = time_passes(steady, (1, 2, 4), passes=5)
    assert times.shape == (MIN_PASSES, 3)  # agreed after three: two passes saved
    assert calls == [1, 2, 4, 4, 2, 1, 1, 2, 4]  # ascending, descending, ascending
    jitter = iter(np.tile([1.0, 1.6], 20))
    assert time_passes(lambda q: cpu_time(q) * next(jitter), (1, 2), passes=5).shape == (5, 2)
    assert time_passes(steady, (1, 2), passes=1).shape == (1, 2)


class FakeClock:
    """A clock that only moves when a fake forward 'takes' time: ``forward(seconds)`` wraps a
    time_one so each call advances the clock by what it returns."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def forward(self, seconds):
        def time_one(q, route=None):
            took = seconds(q) if route is None else seconds(q, route)
            self.now += took
            return took

        return time_one


def test_no_pass_is_begun_or_finished_past_the_deadline():
    clock = FakeClock()
    slow = clock.forward(lambda q: 1.0 + q)  # a pass over (1, 2) takes 5 s and never agrees: 2, 3, 2, 3, ...
    assert time_passes(slow, (1, 2), passes=5, deadline=11.0, clock=clock).shape == (2, 2)  # a 3rd would end at 15
    assert clock.now == 10.0
    clock.now = 0.0
    assert time_passes(slow, (1, 2), passes=5, deadline=1.0, clock=clock).shape == (1, 2)  # the first always runs
    assert time_passes(slow, (1, 2), passes=5, deadline=0.0, clock=clock, whole_first=False).shape == (0, 2)
    clock.now = 0.0
    burst = iter([1.0, 1.0, 9.0] + [1.0] * 20)  # the second pass hits a burst: dropped unfinished
    assert time_passes(clock.forward(lambda q: next(burst)), (1, 2), passes=5, deadline=4.5, clock=clock).shape \
        == (1, 2)
    assert clock.now == 11.0  # two forwards of the first pass, one of the second, the other never begun


def test_measurement_retries_and_falls_back_to_a_repaired_curve():
    bursts = iter([4.5] * 3 + [1.0] * 1000)  # the first try's 3 passes hit a burst at 2 rows

    def busy_then_quiet(q):
        return cpu_time(q) * (next(bursts) if q == 2 else 1.0)

    measured = measure_curve(busy_then_quiet, (1, 2, 3), repeats=3)
    assert measured.problem is None and measured.tries == 2 and measured.passes == 6
    assert np.allclose(measured.seconds, [cpu_time(1), cpu_time(2), cpu_time(3)])

    def always_wrong(q):
        return 0.024 if q == 1 else 0.37

    wrong = measure_curve(always_wrong, (1, 2, 3), repeats=3)
    assert wrong.problem.startswith("from 1 to 2 rows") and wrong.tries == ATTEMPTS
    assert implausibility((1, 2, 3), [wrong.seconds]) is None  # repaired for this run
    now = iter(np.arange(0.0, 1000.0, 10.0))  # every clock read 10 s later: no retry fits in the cap
    slow = measure_curve(always_wrong, (1, 2, 3), repeats=3, cap_s=30.0, clock=lambda: next(now))
    assert slow.tries == 1 and slow.problem is not None


# ---------------------------------------------------------------- online refinement
def test_cost_model_interpolates_and_extrapolates():
    cost = CostModel(np.array([1., 2., 4.]), np.array([1., 0.9, 2.]))  # a dip is kept: it can be real
    assert np.allclose(cost.step(np.array([2., 3., 6.])), [0.9, 1.45, 3.1])


def refine(cost: CostModel, truth, sizes, rounds: int) -> None:
    """Observe ``rounds`` passes over ``sizes``, each step taking truth(q) seconds."""
    for _ in range(rounds):
        for q in sizes:
            cost.observe(q, truth(q))


def test_a_curve_measured_under_load_converges_to_the_real_steps():
    rows = np.array(CPU_ROWS, dtype=np.float64)
    truth = np.array(CPU_SECONDS)
    loaded = CostModel(rows, 5.0 * truth)  # plausible shape, every size 5x too dear
    refine(loaded, cpu_time, [1], 60)  # only plain steps ever ran ...
    assert np.allclose(loaded.step(rows), truth, rtol=0.02)  # ... yet every size follows
    nonsense = np.array([0.32, 0.33, 4.5, 4.5, 0.3, 0.3, 0.2, 0.16, 0.2, 0.25])
    repaired = CostModel(rows, repair(rows, nonsense), trust=TRUST_REPAIRED)
    refine(repaired, cpu_time, range(1, 33), 15)
    assert np.allclose(repaired.step(rows), truth, rtol=0.05)
    good = CostModel(rows, truth)
    good.observe(4, 3 * cpu_time(4))  # one step hit by a burst moves a good curve only a little
    assert (good.step(rows) < 1.6 * truth).all() and (good.step(rows[rows != 4]) < 1.35 * truth[rows != 4]).all()
    refine(good, cpu_time, range(1, 33), 15)
    assert np.allclose(good.step(rows), truth, rtol=0.03)


def test_a_pass_over_more_rows_than_the_curve_spans_is_ignored():
    """A draft catching up on a 400-token prompt must not be read as a dear 16-row step."""
    cost = CostModel(np.array([1., 4., 16.]), np.array([1., 1.2, 2.]))
    cost.observe(400, 30.0)
    assert cost.step(np.array([1., 4., 16.])).tolist() == [1., 1.2, 2.] and cost.steps == 0
    cost.observe(16, 2.0)
    assert cost.steps == 1


def test_refinement_is_bounded_and_can_be_switched_off():
    frozen = CostModel(np.array([1., 2.]), np.array([1., 2.]), smoothing=0.0)
    refine(frozen, lambda q: 5.0, [1, 2], 10)
    assert frozen.step(np.array([1., 2.])).tolist() == [1., 2.] and frozen.steps == 0
    cost = CostModel(np.array([1., 2.]), np.array([1., 2.]))
    refine(cost, lambda q: 0.0, [1, 2], 100)  # absurd step times: the curve stays positive and finite
    assert (cost.step(np.array([1., 2.])) > 0).all() and np.isfinite(cost.seconds).all()


# ---------------------------------------------------------------- cache and messages
@pytest.fixture(scope="module")
def llama():
    model = tiny_model("llama")
    return model, attention_layout(model.config)


def test_row_grid_ends_at_the_largest_step():
    assert row_grid(5) == (1, 2, 3, 4, 5) and row_grid(33)[-2:] == (32, 33) and row_grid(1) == (1,)


def test_measuring_talks_and_reading_the_cache_is_silent(llama, tmp_path, monkeypatch, capsys):
    model, layout = llama
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(cpu_time))
    first = load_cost_model(model, layout, 4, 8, 5, str(tmp_path))
    before, after = capsys.readouterr().err.strip().splitlines()
    assert before.startswith("lookahead: measuring the step cost of") and "1 to 4 rows" in before
    assert "about" in before and f"then kept in {tmp_path} if it looks right and the CPU stays otherwise idle" \
        in before and "once" not in before  # (kept only then: no promise it is measured once)
    assert after.startswith("lookahead: step cost measured in")
    assert f"({first_passes(model) + MIN_PASSES} passes)" in after and "1-4 rows kernel x" in after
    assert "1 row 20 ms" in after and "4 rows 1.4x" in after
    files = os.listdir(tmp_path)
    assert len(files) == 1 and f"cached in {tmp_path / files[0]}" in after
    assert first.rows.tolist() == [1, 2, 3, 4] and first.trust == TRUST_MEASURED and first.store is not None

    monkeypatch.setattr(store, "decode_step_timer", fake_timer(None))  # would fail if it measured
    again = load_cost_model(model, layout, 4, 8, 5, str(tmp_path))
    assert capsys.readouterr().err == "" and again.seconds.tolist() == first.seconds.tolist()
    assert again.store is None  # a curve read back is refined for this run, not written again


def test_a_measurement_told_to_stop_ends_before_its_next_forward_and_keeps_nothing(llama, tmp_path, monkeypatch,
                                                                                    capsys):
    """(a server measuring while idle, whose requests came back: store.py's ``stop``)"""
    model, layout = llama
    forwards = []
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(lambda q: forwards.append(q) or cpu_time(q)))
    with pytest.raises(store.MeasurementStopped):
        load_cost_model(model, layout, 4, 8, 5, str(tmp_path), batch=2, stop=lambda: len(forwards) >= 3)
    assert len(forwards) == 3 and os.listdir(tmp_path) == []
    assert "stopped: requests arrived; it is measured again when the server is next idle" in capsys.readouterr().err
    with pytest.raises(store.MeasurementStopped):  # (already told: nothing is run, nothing said)
        load_cost_model(model, layout, 4, 8, 5, str(tmp_path), batch=2, stop=lambda: True)
    assert len(forwards) == 3 and capsys.readouterr().err == ""
    curve = load_cost_model(model, layout, 4, 8, 5, str(tmp_path), batch=2, stop=lambda: False)
    assert curve.rows.tolist() == [1, 2, 3, 4] and len(os.listdir(tmp_path)) == 1


def test_a_stoppable_timer_prefills_its_context_in_pieces_it_can_stop_between(llama):
    """(the synthetic context of an idle-time measurement: a request arriving meanwhile waits for one piece of
    PREFILL_CHUNK columns, not for the whole prefill)"""
    from lookahead.cost.measure import PREFILL_CHUNK, decode_step_timer

    model, layout = llama
    asked = []

    def stop():
        asked.append(1)
        return len(asked) >= 2

    context = 2 * PREFILL_CHUNK + 5
    with pytest.raises(store.MeasurementStopped):
        decode_step_timer(model, layout, context, batch=2, stop=stop)
    assert len(asked) == 2  # (one piece prefilled, then stopped)
    timer = decode_step_timer(model, layout, context, batch=2, stop=lambda: False)
    assert timer.cache.get_seq_length() == context and timer(1) > 0


def test_a_timed_step_reads_its_logits_back_as_the_decode_loop_does(llama, monkeypatch):
    """(the verifier's row_argmax: on the CPU numpy's, several times faster than torch's over a large vocabulary,
    so that a many-row step is not priced dearer than the loop's steps cost)"""
    from lookahead.cost import measure

    model, layout = llama
    read = []
    real = measure.row_argmax
    monkeypatch.setattr(measure, "row_argmax", lambda scores: read.append(tuple(scores.shape)) or real(scores))
    timer = measure.decode_step_timer(model, layout, 8, batch=2)
    assert timer(3) > 0 and read == [(2 * 3, model.config.vocab_size)]


def test_a_real_measurement_talks_and_keeps_only_a_plausible_curve(llama, tmp_path, capsys):
    """A real forward of the tiny Llama is timed: the machine may be busy, so every outcome is allowed,
    and each must say what happened."""
    model, layout = llama
    cost = load_cost_model(model, layout, 4, 8, 2, str(tmp_path))
    before, after = capsys.readouterr().err.strip().splitlines()
    assert before.startswith("lookahead: measuring") and after.startswith("lookahead: step cost measured in")
    assert cost.rows.tolist() == [1, 2, 3, 4] and (cost.seconds > 0).all()
    if os.listdir(tmp_path):
        assert "cached in" in after and cost.trust == TRUST_MEASURED
        load_cost_model(model, layout, 4, 8, 2, str(tmp_path))
        assert capsys.readouterr().err == ""
    elif "looks wrong" in after:
        assert "not cached" in after and cost.trust == TRUST_REPAIRED
    else:  # measured while other processes kept the CPU busy
        assert "cores busy meanwhile" in after and "not cached" in after and cost.store is None


def test_an_implausible_curve_is_not_cached_until_real_steps_refine_it(llama, tmp_path, monkeypatch, capsys):
    model, layout = llama
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(lambda q: 0.024 if q == 1 else 0.37))
    cost = load_cost_model(model, layout, 4, 8, 3, str(tmp_path))
    after = capsys.readouterr().err.strip().splitlines()[-1]
    assert "looks wrong (from 1 to 2 rows the time grew 15.4x" in after and "not cached" in after
    assert os.listdir(tmp_path) == [] and cost.trust == TRUST_REPAIRED and cost.repaired
    refine(cost, cpu_time, [1, 2, 4], CONFIRM_STEPS)  # 3 rows never ran: still a guess there
    assert os.listdir(tmp_path) == [] and cost.store is not None
    refine(cost, cpu_time, [3], 1)  # every size ran: written back at the next CONFIRM_STEPS
    refine(cost, cpu_time, [1, 2, 3, 4], CONFIRM_STEPS // 4)
    files = os.listdir(tmp_path)
    assert len(files) == 1 and cost.store is None
    saved = json.loads((tmp_path / files[0]).read_text())["seconds"]
    assert np.allclose(saved, [cpu_time(q) for q in (1, 2, 3, 4)], rtol=0.1)
    assert load_cost_model(model, layout, 4, 8, 3, str(tmp_path)).seconds.tolist() == saved
    assert capsys.readouterr().err == ""


def test_a_fresh_curve_is_written_back_refined(llama, tmp_path, monkeypatch):
    model, layout = llama
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(lambda q: 3 * cpu_time(q)))  # a busy moment
    cost = load_cost_model(model, layout, 4, 8, 3, str(tmp_path))
    path = tmp_path / os.listdir(tmp_path)[0]
    assert np.allclose(json.loads(path.read_text())["seconds"], [3 * cpu_time(q) for q in (1, 2, 3, 4)])
    refine(cost, cpu_time, [1, 3], CONFIRM_STEPS // 2)
    assert np.allclose(json.loads(path.read_text())["seconds"], [cpu_time(q) for q in (1, 2, 3, 4)], rtol=0.1)


def test_cache_keys_and_damaged_or_implausible_files(llama, tmp_path, monkeypatch, capsys):
    model, layout = llama
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(cpu_time))
    load_cost_model(model, layout, 4, 8, 1, str(tmp_path))
    path = tmp_path / os.listdir(tmp_path)[0]
    load_cost_model(model, layout, 5, 8, 1, str(tmp_path))  # other rows: another key
    load_cost_model(model, layout, 4, 8, 2, str(tmp_path))  # more passes per size: kept apart
    assert len(os.listdir(tmp_path)) == 3
    capsys.readouterr()
    path.write_text("{not json")
    load_cost_model(model, layout, 4, 8, 1, str(tmp_path))  # corrupt file: measured again
    assert "measuring" in capsys.readouterr().err
    data = json.loads(path.read_text())
    assert data["seconds"] == [cpu_time(q) for q in (1, 2, 3, 4)]
    data["seconds"] = [0.32, 4.5, 4.5, 0.16]  # nonsense cached by an older version: measured again
    path.write_text(json.dumps(data))
    assert load_cost_model(model, layout, 4, 8, 1, str(tmp_path)).seconds.tolist() == [cpu_time(q)
                                                                                      for q in (1, 2, 3, 4)]
    assert "measuring" in capsys.readouterr().err


def test_without_a_cache_dir_nothing_touches_the_disk(llama, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(cpu_time))
    model, layout = llama
    cost = load_cost_model(model, layout, 3, 8, 1, "")
    assert cost.rows.tolist() == [1, 2, 3] and os.listdir(tmp_path) == [] and cost.store is None
    before, after = capsys.readouterr().err.strip().splitlines()
    assert "not kept: cost_cache_dir is empty" in before and "not cached" in after


# ---------------------------------------------------------------- routes, load, the CPU
def test_routes_are_measured_chosen_and_cached_with_the_cpu(llama, tmp_path, monkeypatch):
    model, layout = llama
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(cpu_time))
    cost = load_cost_model(model, layout, 4, 8, 3, str(tmp_path))
    routes = measure.measured_routes(model, True)
    fastest = routes.index(next(r for r in routes if r.linear == "kernel" and r.threads == torch.get_num_threads()))
    assert cost.routing.choice.tolist() == [fastest] * 4
    assert np.allclose(cost.routing.seconds[fastest], [cpu_time(q) for q in (1, 2, 3, 4)])
    assert np.allclose(np.delete(cost.routing.seconds, fastest, axis=0), SLOWER * cost.routing.seconds[fastest])
    saved = json.loads((tmp_path / os.listdir(tmp_path)[0]).read_text())
    assert saved["fingerprint"]["cpu"] == measure.cpu_name() and saved["fingerprint"]["threads"] == \
        torch.get_num_threads() and saved["fingerprint"]["routes"] == [r.label for r in routes]
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(None))  # read back, not measured
    again = load_cost_model(model, layout, 4, 8, 3, str(tmp_path))
    assert np.array_equal(again.routing.seconds, cost.routing.seconds)
    assert again.routing.choice.tolist() == [fastest] * 4


def test_without_the_kernel_only_torch_routes_are_measured(llama, monkeypatch):
    model, _ = llama
    assert {r.linear for r in measure.measured_routes(model, False)} == {"torch", "mm"}
    assert {r.linear for r in measure.measured_routes(model, True)} == {"torch", "mm", "kernel"}
    assert {r.threads for r in measure.measured_routes(model, True)} == {1, torch.get_num_threads()}
    from lookahead.model.fewrows import onednn_available
    offered = {r.linear for r in measure.measured_routes(model, False, onednn=True)}
    assert offered == ({"torch", "mm", "onednn"} if onednn_available() else {"torch", "mm"})  # torch's oneDNN too


def test_a_model_of_quantized_linears_is_measured_once_a_thread_count():
    """No linear layer a route reroutes (every one quantized): the routes' linear kinds would run the same
    ops, so torch's alone is measured at each thread count, whatever is offered."""
    from gguf import GGMLQuantizationType as Q
    from test_quantized import quantized_model

    from lookahead.model.fewrows import routable_linears
    model = quantized_model("llama", Q.Q8_0)
    assert routable_linears(model) == []
    from lookahead.model.routing import Route, candidate_routes
    assert candidate_routes(2, True, rerouted=False) == [Route(2, "torch"), Route(1, "torch")]  # (the worked example)
    for kernel in (False, True):
        routes = measure.measured_routes(model, kernel, onednn=True)
        assert [r.linear for r in routes] == ["torch"] * len(routes)
        assert {r.threads for r in routes} == {1, torch.get_num_threads()}


def test_load_cost_model_offers_the_onednn_route_only_when_asked(llama, tmp_path, monkeypatch):
    model, layout = llama
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(cpu_time))
    seen, real = [], store.measured_routes

    def recording(model, kernel, onednn=False):
        seen.append(onednn)
        return real(model, kernel, onednn)

    monkeypatch.setattr(store, "measured_routes", recording)
    load_cost_model(model, layout, 4, 8, 3, str(tmp_path / "default"))
    load_cost_model(model, layout, 4, 8, 3, str(tmp_path / "asked"), switches=ForwardSwitches(onednn=True))
    assert seen == [False, True]


def test_a_curve_measured_under_load_is_used_but_not_cached(llama, tmp_path, monkeypatch, capsys):
    model, layout = llama
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(cpu_time))
    monkeypatch.setattr(store, "others_busy", lambda before, after: 0.9)
    cost = load_cost_model(model, layout, 4, 8, 3, str(tmp_path))
    after = capsys.readouterr().err.strip().splitlines()[-1]
    assert "other processes kept 0.9 of" in after and "not cached" in after
    assert os.listdir(tmp_path) == [] and cost.store is None  # nor written back once refined
    refine(cost, cpu_time, [1, 2, 3, 4], CONFIRM_STEPS)
    assert os.listdir(tmp_path) == []


def test_others_busy_counts_only_other_processes():
    before = (0.0, 10.0, 1.0)
    assert measure.others_busy(before, (2.0, 14.0, 5.0)) == 0.0  # all the busy time was ours
    assert measure.others_busy(before, (2.0, 13.0, 2.0)) == 1.0  # one core busy elsewhere
    assert measure.others_busy(before, before) == 0.0
    assert measure.others_busy(before, (0.1, 10.5, 1.0)) == 0.0  # too short a span to tell
    now = measure.cpu_snapshot()
    assert len(now) == 3 and all(v >= 0 for v in now)


def test_a_hopeless_route_is_timed_once_and_extrapolated():
    from lookahead.model.routing import Route

    calls = []

    def time_one(q, route):
        calls.append((q, route))
        return cpu_time(q) * (20.0 if route.threads == 2 else 1.0)  # two threads beside a busy core

    routes = [Route(2, "torch"), Route(2, "kernel"), Route(1, "torch"), Route(1, "kernel")]
    first = measure.first_pass(time_one, (1, 2, 4), routes)
    assert [c for c in calls if c[1].threads == 2] == [(1, routes[0]), (1, routes[1])]  # one forward each
    assert np.allclose(first[0], 20 * first[2]) and np.allclose(first[3], [cpu_time(q) for q in (1, 2, 4)])
    calls.clear()
    seconds, measured = measure.measure_routes(time_one, (1, 2, 4), routes, 3)
    assert measured.problem is None and np.allclose(measured.seconds, [cpu_time(q) for q in (1, 2, 4)])
    assert all(c[1].threads == 1 for c in calls[len(routes) + 4:])  # only one-thread routes measured on


def test_the_timed_step_hands_the_target_writable_arrays():
    """torch warns (once, on the user's stderr) when it wraps a read-only NumPy array: a one-row
    broadcast view is one. The timed step's arrays are the target's own copies, for every batch."""

    class Probe:
        device = torch.device("cpu")

        def step(self, cache, tokens, positions, local, keep, past, slots):
            assert all(a.flags.writeable for a in (tokens, positions, local, keep))
            assert positions.shape == tokens.shape and local.shape == tokens.shape + (tokens.shape[1],)
            assert (slots is None) == (tokens.shape[0] == 1) and past == 8
            return "ran"

    for batch in (1, 3):
        assert measure._step_pass(Probe(), np.zeros((batch, 4), dtype=np.int64), 8)(None) == "ran"
