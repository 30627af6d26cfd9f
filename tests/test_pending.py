"""A batch size whose cost curve the disk does not hold (lookahead/cost/policy.py): an open batch prices it by a
stand-in at once instead of stalling its streams for a measurement, runs through the nearest measured size's
routes, and the curve is measured when the caller is idle (``measure_pending``; the server's engine between
requests, the warm-up for the sizes it ran); ``generate`` over several prompts still measures on first use."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch
from conftest import VOCAB, tiny_model
from test_continuous import alone

import lookahead.cost.policy as policy
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.cost.curve import TRUST_REPAIRED, CostModel, row_grid, stand_in_curve
from lookahead.cost.store import MeasurementStopped
from lookahead.serve.engine import Completion, Engine
from lookahead.serve.warmup import warm_up

NO_EOS = [VOCAB + 1000]
PROMPTS = [[5, 9, 13, 17, 21] * 3, [40, 41, 42, 40, 41, 42, 7], [11, 12], [30] * 9]


def test_a_stand_in_reads_its_base_curve_at_as_many_rows_in_all():
    base = CostModel(np.array([1.0, 2.0, 4.0]), np.array([0.010, 0.012, 0.016]))
    stand = stand_in_curve(base, 2.0)
    np.testing.assert_allclose(stand.seconds, [0.012, 0.016, 0.024])  # (8 rows: along the last segment)
    np.testing.assert_array_equal(stand.rows, base.rows)
    assert stand.trust == TRUST_REPAIRED and stand.smoothing == base.smoothing
    stand.observe(2, 0.05)  # refined by the steps that run on it, its base untouched
    assert stand.seconds[1] > 0.016 and base.seconds[1] == 0.012
    flat = CostModel(np.array([1.0, 8.0]), np.array([0.01, 0.01]), smoothing=0.0)
    np.testing.assert_array_equal(stand_in_curve(flat, 3.0).seconds, [0.01, 0.01])  # flat stays flat


@pytest.fixture
def empty_disk(monkeypatch):
    """The disk holds no curve; the batch sizes measured (conftest's synthetic curve), in order."""
    measured: list[int] = []
    synthetic = policy.load_cost_model

    def load(*args, **kwargs):
        measured.append(args[6] if len(args) > 6 else kwargs.get("batch", 1))  # (model, ..., cache_dir, batch)
        return synthetic(*args, **kwargs)

    monkeypatch.setattr(policy, "cached_cost_model", lambda *args, **kwargs: None)
    monkeypatch.setattr(policy, "load_cost_model", load)
    return measured


async def collect(ticket) -> list[int]:
    """A ticket's streamed tokens, to its end."""
    tokens = []
    async for event in ticket.events():
        tokens.extend(event.tokens)
    return tokens


async def answers(engine: Engine, prompts: list[list[int]], new: int) -> list[list[int]]:
    """Every prompt submitted at once (``new`` tokens each), each one's tokens collected to its end."""
    tickets = [engine.submit(Completion(p, new)) for p in prompts]
    return await asyncio.wait_for(asyncio.gather(*(collect(t) for t in tickets)), 120)


async def until(condition, seconds: float = 60) -> None:
    """Wait (at most ``seconds``) until ``condition()`` holds."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def joined(gen: LookaheadGenerator, prompts: list[list[int]], new: int) -> list[list[int]]:
    """An open batch of ``prompts`` joined at once, stepped until it drains: each one's new tokens."""
    batch = gen.open_batch()
    with torch.inference_mode():
        handles = [batch.join(p, max_new_tokens=new, eos_token_id=NO_EOS, do_sample=False) for p in prompts]
        for _ in range(200):
            if not batch.handles:
                break
            batch.step()
    assert not batch.handles, "the batch never drained"
    return [h.output_ids.tolist() for h in handles]


def test_an_open_batch_of_a_new_size_runs_on_a_stand_in_and_measures_when_asked(empty_disk):
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig())
    assert empty_disk == [1]  # (the one-sequence curve, at construction)
    out = joined(gen, PROMPTS[:3], 16)
    assert out == [alone(model, p, 16) for p in PROMPTS[:3]]  # exact on the stand-in
    assert empty_disk == [1]  # no stream waited for a measurement
    assert 3 in gen.pending_curves and set(gen.pending_curves) <= {2, 3}  # (2: where one finished first)
    single = gen.cost
    assert single is not None
    stand = gen.costs.stand_ins[3]
    assert stand is not None and stand.trust == TRUST_REPAIRED
    rows = np.array(row_grid(int(single.rows[-1])), dtype=np.float64)
    assert stand.rows.tolist() == rows.tolist()

    pending = gen.pending_curves
    assert [gen.measure_pending() for _ in pending] == list(pending) and gen.measure_pending() is None
    assert empty_disk == [1, *pending] and gen.pending_curves == ()
    assert set(gen.costs.batches) == set(pending) and not gen.costs.stand_ins
    assert joined(gen, PROMPTS[:3], 16) == out and empty_disk == [1, *pending]  # measured ones are kept


def test_a_stand_in_comes_from_the_largest_smaller_size_measured(empty_disk):
    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig())
    run, single = gen.run_config, gen.cost
    assert single is not None
    assert gen.costs.for_batch(2, run, single, wait=True) is not None and empty_disk == [1, 2]  # (generate's way)
    two = gen.costs.batches[2]
    assert two is not None
    four = gen.costs.for_batch(4, run, single, wait=False)
    assert four is not None and empty_disk == [1, 2] and gen.pending_curves == (4,)
    np.testing.assert_allclose(four.seconds, two.step(four.rows * 2.0))
    assert gen.costs.for_batch(4, run, single, wait=False) is four  # made once, refined in place


def test_a_size_without_routes_runs_through_the_nearest_measured_ones():
    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig())
    target = gen.target
    one, three, five = object(), object(), object()
    target.routings = {1: one, 3: three}
    assert target.routing(1) is one and target.routing(2) is three  # the least larger (as before)
    assert target.routing(4) is three  # the largest smaller: a size an open batch has not measured yet
    target.routings[5] = five
    assert target.routing(4) is five
    target.routings = {}
    assert target.routing(2) is None


def test_a_pending_measurement_that_is_stopped_stays_pending(empty_disk, monkeypatch):
    gen = LookaheadGenerator(tiny_model("llama"), config=LookaheadConfig())
    assert gen.costs.for_batch(3, gen.run_config, gen.cost, wait=False) is not None and gen.pending_curves == (3,)
    told = []
    synthetic = policy.load_cost_model

    def load(*args, stop=None, **kwargs):
        told.append(stop)
        if stop is not None and stop():
            raise MeasurementStopped("work arrived")
        return synthetic(*args, **kwargs)

    monkeypatch.setattr(policy, "load_cost_model", load)
    assert gen.measure_pending(stop=lambda: True) is None
    assert gen.pending_curves == (3,) and 3 in gen.costs.stand_ins and 3 not in gen.costs.batches
    assert gen.measure_pending(stop=lambda: False) == 3 and gen.pending_curves == () and 3 in gen.costs.batches
    assert len(told) == 2 and all(callable(stop) for stop in told)


def test_the_warm_up_measures_the_sizes_it_ran(empty_disk):
    gen = LookaheadGenerator(tiny_model("qwen2"), config=LookaheadConfig())
    warm_up(gen, max_batch=4)
    assert empty_disk == [1, 2, 3] and gen.pending_curves == ()


def test_the_engine_measures_a_pending_curve_once_idle(empty_disk, monkeypatch):
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig())
    engine = Engine(gen, max_batch=4, max_queue=8)
    busy_then: list[int] = []  # requests running or waiting at each measurement
    counted = policy.load_cost_model

    def load(*args, **kwargs):
        busy_then.append(len(engine._live) + len(engine._waiting))
        return counted(*args, **kwargs)

    monkeypatch.setattr(policy, "load_cost_model", load)

    async def main():
        engine.start()
        try:
            results = await answers(engine, PROMPTS, 14)
            await until(lambda: not gen.pending_curves)
            return results
        finally:
            engine.stop()

    results = asyncio.run(main())
    assert results == [alone(model, p, 14) for p in PROMPTS]
    assert gen.pending_curves == () and 4 in empty_disk and empty_disk[0] == 1
    assert busy_then and busy_then == [0] * len(busy_then)  # measured only while no request ran or waited


def test_a_request_arriving_during_an_idle_measurement_stops_it(empty_disk, monkeypatch):
    """The engine measures a pending curve once idle; a request that arrives meanwhile ends the measurement
    (before its next forward), is answered, and the curve is measured at the next idle moment."""
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig())
    engine = Engine(gen, max_batch=4, max_queue=8)
    synthetic = policy.load_cost_model
    began, stopped = [], []

    def load(*args, stop=None, **kwargs):
        if stop is None:
            return synthetic(*args, **kwargs)
        began.append(time.monotonic())
        if len(began) == 1:  # the first idle measurement: 'forwards' until told to stop (at most 60 s)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if stop():
                    stopped.append(len(engine._waiting))
                    raise MeasurementStopped("work arrived")
                time.sleep(0.01)
        return synthetic(*args, **kwargs)

    monkeypatch.setattr(policy, "load_cost_model", load)

    async def main():
        engine.start()
        try:
            first = await answers(engine, PROMPTS, 10)
            await until(lambda: len(began) >= 1)  # measuring while idle
            late = await asyncio.wait_for(collect(engine.submit(Completion(PROMPTS[0], 12))), 120)
            await until(lambda: not gen.pending_curves)  # measured at the next idle moment
            return first, late
        finally:
            engine.stop()

    first, late = asyncio.run(main())
    assert first == [alone(model, p, 10) for p in PROMPTS] and late == alone(model, PROMPTS[0], 12)
    assert stopped == [1]  # stopped with the late request waiting
    assert len(began) >= 2 and gen.pending_curves == ()


def test_an_idle_measurement_that_fails_is_said_and_the_engine_goes_on(empty_disk, monkeypatch, capsys):
    model = tiny_model("llama")
    gen = LookaheadGenerator(model, config=LookaheadConfig())
    engine = Engine(gen, max_batch=4, max_queue=8)
    synthetic = policy.load_cost_model
    failed = []

    def load(*args, stop=None, **kwargs):
        if stop is not None:  # (an idle-time measurement)
            failed.append(args[6] if len(args) > 6 else kwargs.get("batch", 1))
            raise RuntimeError("the synthetic prefill ran out of memory")
        return synthetic(*args, **kwargs)

    monkeypatch.setattr(policy, "load_cost_model", load)

    async def main():
        engine.start()
        try:
            first = await answers(engine, PROMPTS, 10)
            await until(lambda: bool(failed) and not gen.pending_curves)
            late = await asyncio.wait_for(collect(engine.submit(Completion(PROMPTS[1], 10))), 120)
            return first, late
        finally:
            engine.stop()

    first, late = asyncio.run(main())
    assert first == [alone(model, p, 10) for p in PROMPTS] and late == alone(model, PROMPTS[1], 10)
    assert 4 in failed and sorted(set(failed)) == sorted(failed)  # each size tried once, not again
    assert gen.pending_curves == ()
    kept = gen.costs.batches[4]  # the size keeps its stand-in as its curve ...
    assert kept is not None and kept.trust == TRUST_REPAIRED and 4 not in gen.costs.stand_ins
    assert gen.costs.for_batch(4, gen.run_config, gen.cost, wait=False) is kept and gen.pending_curves == ()  # (... for good)
    err = capsys.readouterr().err
    assert err.count("lookahead: measuring a batch size's step cost failed (RuntimeError: the synthetic prefill ran "
                     "out of memory); that size keeps the curve it was priced by") == len(failed)
