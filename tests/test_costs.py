"""The cost measurement is honest and cheap to live with (issue 36): what it says on a busy CPU and whether
it keeps the curve (``keep_busy_curve``), its wall-clock bound (``calibration_seconds``, on a fake clock),
and ``lookahead costs list / measure / clear`` through click's CliRunner on a tiny model. Fake timers
throughout (tests/test_costmodel.py's); no test asserts a duration of the real clock."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import save_model_dir, tiny_model
from test_costmodel import FakeClock, cpu_time, fake_timer, refine

import lookahead.cost.measure as measure
import lookahead.cost.policy as engine
import lookahead.cost.store as store
from lookahead.model.switches import ForwardSwitches
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.cli.main import main
from lookahead.config import ConfigError
from lookahead.cost.curve import CONFIRM_STEPS, row_grid
from lookahead.cost.measure import coarser_grids, measure_curve, measure_routes, plan_measurement
from lookahead.cost.store import load_cost_model
from lookahead.model.support import attention_layout

ROWS = row_grid(33)  # (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 33): the default largest step's grid


@pytest.fixture(scope="module")
def llama():
    model = tiny_model("llama")
    return model, attention_layout(model.config)


def lines(capsys) -> tuple[str, str]:
    """(the announcement, the outcome) a measurement said on stderr."""
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 2, said
    return said[0], said[1]


# ---------------------------------------------------------------- a busy CPU
def test_a_busy_measurement_says_it_measures_again_and_how_to_avoid_it(llama, tmp_path, monkeypatch, capsys):
    model, layout = llama
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(cpu_time))
    monkeypatch.setattr(store, "others_busy", lambda before, after: 1.3)
    cost = load_cost_model(model, layout, 4, 8, 3, str(tmp_path))
    before, after = lines(capsys)
    assert "once" not in before and "if it looks right and the CPU stays otherwise idle" in before
    assert "other processes kept 1.3 of" in after and "used for this run only and not cached" in after
    assert "the next run measures again" in after
    assert "--keep-busy-curve (keep_busy_curve=True)" in after and "lookahead costs measure --model NAME" in after
    assert os.listdir(tmp_path) == [] and cost.store is None and cost.cached is None
    refine(cost, cpu_time, [1, 2, 3, 4], CONFIRM_STEPS)  # nor written back once refined
    assert os.listdir(tmp_path) == []
    load_cost_model(model, layout, 4, 8, 3, str(tmp_path))  # and the next run does measure again
    assert "measuring" in capsys.readouterr().err


def test_keep_busy_curve_caches_it_anyway_and_the_next_run_reads_it(llama, tmp_path, monkeypatch, capsys):
    model, layout = llama
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(cpu_time))
    monkeypatch.setattr(store, "others_busy", lambda before, after: 1.3)
    cost = load_cost_model(model, layout, 4, 8, 3, str(tmp_path), keep_busy=True)
    before, after = lines(capsys)
    files = os.listdir(tmp_path)
    assert len(files) == 1 and cost.cached == str(tmp_path / files[0])
    assert "once" not in before and f"then kept in {tmp_path} if it looks right" in before
    assert "idle" not in before
    assert f"cached anyway (keep_busy_curve) in {tmp_path / files[0]}" in after and "measures again" not in after
    saved = json.loads((tmp_path / files[0]).read_text())
    assert saved["about"]["busy_cores"] == 1.3 and saved["about"]["cuts"] == []
    assert cost.store is not None  # this run's steps refine it and write it back
    refine(cost, lambda q: 0.5 * cpu_time(q), [1, 2, 3, 4], CONFIRM_STEPS)
    again = json.loads((tmp_path / files[0]).read_text())
    assert again["seconds"] != saved["seconds"] and again["about"]["refined_steps"] == CONFIRM_STEPS
    assert again["about"]["busy_cores"] == 1.3  # what the file said before is kept beside
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(None))  # would fail if it measured
    assert load_cost_model(model, layout, 4, 8, 3, str(tmp_path)).seconds.tolist() == again["seconds"]
    assert capsys.readouterr().err == ""


def test_a_busy_and_implausible_curve_promises_nothing(llama, tmp_path, monkeypatch, capsys):
    model, layout = llama
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(lambda q: 0.024 if q == 1 else 0.37))
    monkeypatch.setattr(store, "others_busy", lambda before, after: 0.9)
    cost = load_cost_model(model, layout, 4, 8, 3, str(tmp_path))
    after = lines(capsys)[1]
    assert "looks wrong" in after and "the next run measures again" in after and "caches it once" not in after
    assert cost.store is None
    load_cost_model(model, layout, 4, 8, 3, str(tmp_path), keep_busy=True)  # kept: cached once steps fix it
    assert "caches it once they make it look right" in lines(capsys)[1]


def test_a_quiet_measurement_is_cached_whatever_keep_busy_says(llama, tmp_path, monkeypatch, capsys):
    model, layout = llama
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(cpu_time))
    monkeypatch.setattr(store, "others_busy", lambda before, after: 0.1)
    for keep in (False, True):
        cost = load_cost_model(model, layout, 4, 8, 3, str(tmp_path / str(keep)), keep_busy=keep)
        assert f"cached in {cost.cached}" in lines(capsys)[1] and cost.cached is not None


def test_the_config_fields_are_validated_and_reach_the_measurement(llama, tmp_path, monkeypatch):
    assert LookaheadConfig().calibration_seconds == 12 and LookaheadConfig().keep_busy_curve is False
    for bad, message in ((dict(calibration_seconds=0), "calibration_seconds must be between 1 and 3600"),
                         (dict(calibration_seconds=2.5), "calibration_seconds must be an integer"),
                         (dict(keep_busy_curve="yes"), "keep_busy_curve must be True or False")):
        with pytest.raises(ConfigError, match=message):
            LookaheadConfig(**bad)
    assert engine.measuring(LookaheadConfig()) == {"bound_s": 12.0, "keep_busy": False, "fresh": False}
    assert engine.measuring(LookaheadConfig(calibration_seconds=5, keep_busy_curve=True), fresh=True) == \
        {"bound_s": 5.0, "keep_busy": True, "fresh": True}
    switches = ForwardSwitches.of(LookaheadConfig(native_linear=False, native_attention=False, cuda_graphs=False))
    assert (switches.native, switches.attention, switches.graphs, switches.traced) == (False, False, False, True)
    model, _ = llama
    monkeypatch.setattr(engine, "load_cost_model", store.load_cost_model)  # measure (fakely) for real here
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(cpu_time))
    monkeypatch.setattr(store, "others_busy", lambda before, after: 2.0)
    LookaheadGenerator(model, config=LookaheadConfig(cost_cache_dir=str(tmp_path / "default")))
    assert not (tmp_path / "default").exists()
    gen = LookaheadGenerator(model, config=LookaheadConfig(cost_cache_dir=str(tmp_path / "kept"), keep_busy_curve=True))
    assert gen.cost is not None and len(os.listdir(tmp_path / "kept")) == 1


# ---------------------------------------------------------------- the time bound
def test_coarser_grids_keep_both_ends():
    assert coarser_grids(ROWS) == [ROWS, (1, 2, 4, 8, 16, 33), (1, 4, 16, 33), (1, 33)]
    assert coarser_grids((1, 2, 3)) == [(1, 2, 3), (1, 3)]
    assert coarser_grids((1,)) == [(1,)]


def test_the_plan_fits_the_time_left():
    routes = ["a", "b", "c"]  # a first pass over 3 routes, then 3 agreeing passes: 6 passes likely
    whole = plan_measurement(ROWS, routes, 5, (1.0, 2.0), left=1000.0)
    assert whole.rows == ROWS and whole.passes == 5 and whole.cuts == () and whole.fits
    one_pass = float(np.interp(ROWS, (1, 33), (1.0, 2.0)).sum())  # ~ 14.5 s over the whole grid
    assert whole.likely == pytest.approx(6 * one_pass)
    coarse = plan_measurement(ROWS, routes, 5, (1.0, 2.0), left=60.0)  # the powers of 2: 6 row counts
    assert coarse.rows == (1, 2, 4, 8, 16, 33) and coarse.passes == 5 and coarse.fits and coarse.likely <= 60
    assert coarse.cuts == ("timed 6 of 11 row counts (1, 2, 4, 8, 16, 33; the others interpolated)",)
    fewer = plan_measurement(ROWS, routes, 5, (1.0, 2.0), left=30.0)
    assert fewer.fits and fewer.likely <= 30 and fewer.passes < 3
    assert any("per row count (not 3 that agree)" in cut for cut in fewer.cuts)
    least = plan_measurement(ROWS, routes, 5, (1.0, 2.0), left=1.0)
    assert least.rows == (1, 33) and least.passes == 1 and not least.fits
    single = plan_measurement(ROWS, [None], 2, (1.0, 2.0), left=1000.0)  # one route (a GPU): no first round
    assert single.passes == 2 and single.likely == pytest.approx(2 * one_pass)


def test_routes_keep_to_their_time_bound():
    from lookahead.model.routing import Route

    clock = FakeClock()
    routes = [Route(1, "torch"), Route(1, "kernel"), Route(1, "mm")]
    noisy = iter(np.tile([1.0, 1.3, 0.8, 1.2], 1000))  # passes that never agree: only the bound ends them
    time_one = clock.forward(lambda q, route: 0.1 * cpu_time(q) / 0.02 * next(noisy))  # 0.1 s at 1 row
    seconds, measured = measure_routes(time_one, ROWS, routes, 100, cap_s=20.0, clock=clock)
    longest = 0.1 * cpu_time(33) / 0.02 * 1.3
    assert clock.now <= 20.0 + longest and measured.cut and seconds.shape == (3, len(ROWS))
    clock.now = 0.0
    first_only = measure_routes(time_one, ROWS, routes, 100, cap_s=0.5, clock=clock)[1]  # less than a pass
    assert first_only.cut and first_only.passes == 1 and clock.now <= 3 * sum(0.1 * cpu_time(q) / 0.02 * 1.3
                                                                              for q in ROWS) + longest


def test_a_curve_without_time_for_a_pass_falls_back():
    clock = FakeClock()
    fallback = np.array([cpu_time(q) for q in (1, 2, 3)])
    got = measure_curve(clock.forward(cpu_time), (1, 2, 3), 5, cap_s=0.0, clock=clock, fallback=fallback)
    assert got.passes == 0 and got.cut and got.seconds.tolist() == fallback.tolist() and clock.now == 0.0


def test_a_measurement_keeps_to_its_bound_and_says_what_it_cut(llama, tmp_path, monkeypatch, capsys):
    """A slow machine (a one-row forward 0.5 s): the whole grid with three agreeing passes would take
    about a minute; bounded at 20 s it times fewer row counts, says so, and the curve covers every row
    count (interpolated) and is cached."""
    model, layout = llama
    clock = FakeClock()
    slow = clock.forward(lambda q, route=None: 25 * cpu_time(q) * (1.0 if route is None or route.linear == "kernel"
                                                                   else 1.6))
    monkeypatch.setattr(store, "decode_step_timer",
                        lambda model, layout, context, seed=0, batch=1, switches=None, stop=None: slow)
    monkeypatch.setattr(store, "others_busy", lambda before, after: 0.0)
    cost = load_cost_model(model, layout, 33, 8, 5, str(tmp_path), bound_s=20.0, clock=clock)
    before, after = lines(capsys)
    assert clock.now <= 20.0 and "measured in" in after
    assert "about" in before and "over the" not in before
    assert "to keep within 20 s (calibration_seconds) it timed" in after and "of 11 row counts" in after
    assert "the others interpolated" in after and "cached in" in after
    routes = measure.measured_routes(model, True)
    assert cost.rows.tolist() == list(ROWS) and cost.routing.seconds.shape == (len(routes), len(ROWS))
    assert np.all(np.diff(cost.seconds[cost.rows >= 16]) >= 0)  # interpolated between the timed ones
    saved = json.loads((tmp_path / os.listdir(tmp_path)[0]).read_text())
    assert len(saved["seconds"]) == len(ROWS) and saved["about"]["cuts"] and saved["about"]["bound_s"] == 20.0
    assert len(saved["about"]["rows_timed"]) < len(ROWS)

    clock.now = 0.0
    load_cost_model(model, layout, 33, 8, 5, str(tmp_path / "longer"), bound_s=600.0, clock=clock)
    assert "to keep within" not in lines(capsys)[1]  # time enough: nothing cut

    clock.now = 0.0
    load_cost_model(model, layout, 33, 8, 5, "", bound_s=1.0, clock=clock)  # not even the least fits
    before, after = lines(capsys)
    assert "over the 1.0 s bound (calibration_seconds): it cannot be measured in less" in before
    assert "timed 2 of 11 row counts" in after


# ---------------------------------------------------------------- lookahead costs
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny-llama"), tiny_model("llama"))


@pytest.fixture
def measured_fakely(monkeypatch):
    """The generator's and ``costs measure``'s curves measured by load_cost_model (not the suite's synthetic
    curves), every forward faked (tests/test_costmodel.py's fake_timer), the CPU otherwise idle."""
    monkeypatch.setattr(engine, "load_cost_model", store.load_cost_model)
    monkeypatch.setattr(store, "decode_step_timer", fake_timer(cpu_time))
    monkeypatch.setattr(store, "others_busy", lambda before, after: 0.0)
    return monkeypatch


def cells(header: str, row: str) -> dict[str, str]:
    """A row of ``costs list``'s table as {column: cell}, cut where the header's columns start."""
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    bounds = zip(starts, starts[1:] + [len(row)])
    return {header[a:b].strip(): row[a:b].strip() for a, b in bounds}


def costs(*args: str):
    """``lookahead costs ARGS`` through click's runner (stdout and stderr apart); the result."""
    return CliRunner().invoke(main, ["costs", *args], catch_exceptions=False)


def test_costs_measure_list_and_clear(model_dir, tmp_path, measured_fakely):
    cache = str(tmp_path / "costs")
    empty = costs("list", "--cost-cache-dir", cache)
    assert empty.exit_code == 0 and f"no cost curves in {cache} (the directory does not exist)" in empty.output

    made = costs("measure", "--model", model_dir, "--cost-cache-dir", cache, "--batch-size", "2",
                 "--max-tree-nodes", "4", "--threads", "1")
    assert made.exit_code == 0, made.output
    assert "lookahead: measuring the step cost of" in made.stderr and "batch of 2" in made.stderr
    files = sorted(os.listdir(cache))
    assert len(files) == 2 and f"batch 1: cached in {cache}" in made.stdout and "batch 2: cached in" in made.stdout

    listed = costs("list", "--cost-cache-dir", cache)
    assert listed.exit_code == 0 and f"2 cost curve files in {cache}" in listed.output
    header, *rows = listed.output.splitlines()[1:]
    assert header.split() == ["model", "dtype", "device", "cpu", "threads", "batch", "rows", "written", "file",
                              "notes"]
    table = [cells(header, row) for row in rows]
    assert len(table) == 2 and all(row["model"] == model_dir.replace(os.path.expanduser("~"), "~") for row in table)
    assert {row["batch"] for row in table} == {"1", "2"} and all(row["rows"] == "1-5" for row in table)
    assert all(row["cpu"] == measure.cpu_name() and row["threads"] == "1" and row["file"] in files for row in table)

    again = costs("measure", "--model", model_dir, "--cost-cache-dir", cache, "--max-tree-nodes", "4",
                  "--threads", "1")  # measured again whatever is cached, and written over it
    assert again.exit_code == 0 and "measuring" in again.stderr and sorted(os.listdir(cache)) == files

    (tmp_path / "costs" / "notes.txt").write_text("not ours")  # a file that is no curve is never touched
    (tmp_path / "costs" / ("0" * 24 + ".json")).write_text("{damaged")
    assert "unreadable: no curve file" in costs("list", "--cost-cache-dir", cache).output
    other = costs("clear", "--model", "smollm2-135m", "--cost-cache-dir", cache)
    assert other.exit_code == 0 and "no cost curves of smollm2-135m" in other.output
    assert len(os.listdir(cache)) == 4
    mine = costs("clear", "--model", model_dir, "--cost-cache-dir", cache)
    assert mine.exit_code == 0 and f"removed 2 cost curve files of {model_dir}" in mine.output
    assert sorted(os.listdir(cache)) == ["0" * 24 + ".json", "notes.txt"]
    everything = costs("clear", "--cost-cache-dir", cache)
    assert everything.exit_code == 0 and "removed 1 cost curve file from" in everything.output
    assert os.listdir(cache) == ["notes.txt"]


def test_costs_measure_on_a_busy_cpu_exits_1_unless_asked_to_keep(model_dir, tmp_path, measured_fakely):
    measured_fakely.setattr(store, "others_busy", lambda before, after: 1.5)
    cache = str(tmp_path / "costs")
    busy = costs("measure", "--model", model_dir, "--cost-cache-dir", cache, "--max-tree-nodes", "4")
    assert busy.exit_code == 1 and "batch 1: not cached" in busy.stdout
    assert "the next run measures again" in busy.stderr and "--keep-busy-curve" in busy.stderr
    assert not os.path.exists(cache)
    kept = costs("measure", "--model", model_dir, "--cost-cache-dir", cache, "--max-tree-nodes", "4",
                 "--keep-busy-curve", "--calibration-seconds", "5")
    assert kept.exit_code == 0 and "cached anyway (keep_busy_curve)" in kept.stderr
    assert "kept while other processes kept 1.5 cores busy" in costs("list", "--cost-cache-dir", cache).output


def test_costs_refuses_an_empty_cache_dir_and_bad_options(model_dir):
    for args in (("list", "--cost-cache-dir", ""), ("clear", "--cost-cache-dir", " "),
                 ("measure", "--model", model_dir, "--cost-cache-dir", "")):
        result = costs(*args)
        assert result.exit_code == 2 and "--cost-cache-dir is empty" in result.stderr
    bad = costs("measure", "--model", model_dir, "--calibration-seconds", "0")
    assert bad.exit_code == 2 and "calibration_seconds must be between 1 and 3600" in bad.stderr


def test_the_new_fields_are_options_with_help():
    for command in (["costs", "measure", "--help"], ["generate", "--help"]):
        text = CliRunner().invoke(main, command).output
        assert "--calibration-seconds" in text and "--keep-busy-curve / --no-keep-busy-curve" in text
    assert torch.get_num_threads() == 1  # (the suite's one thread: --threads 1 above changed nothing)


def test_a_generator_measures_the_steps_it_runs_and_costs_measure_writes_its_curve(model_dir, tmp_path,
                                                                                    measured_fakely):
    """Where a generator replays its steps from traces (traced_forward, on the CPU), its curve is measured
    through traced steps and keyed so; `lookahead costs measure` builds its target as a generator does,
    so it writes the very file the generator then reads (and with traced_forward off, an eager one)."""
    seen: list[bool] = []
    timer = store.decode_step_timer

    def recording(*args, switches=None, **kwargs):
        seen.append(switches is not None and switches.traced)
        return timer(*args, switches=switches, **kwargs)

    measured_fakely.setattr(store, "decode_step_timer", recording)
    cache = str(tmp_path / "costs")
    made = costs("measure", "--model", model_dir, "--cost-cache-dir", cache, "--max-tree-nodes", "4",
                 "--threads", "1")
    assert made.exit_code == 0, made.output
    files = os.listdir(cache)
    assert seen == [True] and len(files) == 1
    with open(os.path.join(cache, files[0])) as file:
        assert json.load(file)["fingerprint"]["traced"] is True
    from lookahead import load_model

    model, _ = load_model(model_dir)
    measured_fakely.setattr(engine, "load_cost_model", store.load_cost_model)
    gen = LookaheadGenerator(model, config=LookaheadConfig(cost_cache_dir=cache, max_tree_nodes=4))
    assert gen.cost is not None and gen.cost.cached == os.path.join(cache, files[0]) and seen == [True]
    eager = costs("measure", "--model", model_dir, "--cost-cache-dir", cache, "--max-tree-nodes", "4",
                  "--threads", "1", "--no-traced-forward")
    assert eager.exit_code == 0 and seen == [True, False] and len(os.listdir(cache)) == 2
