"""Timing decode-shaped forwards and checking what they say: the measurement a cost curve starts from.

Measured the first time a model is decoded with the adaptive budget (and
again on every run until a curve is cached, store.py): passes over the grid
of row counts up to the largest step, each pass timing one decode-shaped
forward per row count (explicit positions, a 4-D mask, logits only for the
kept rows, the host sync) after a synthetic context. The passes are
interleaved, so a burst of load elsewhere on the machine hits one pass rather
than one row count, and measuring stops once three passes agree. The whole
measurement has a wall-clock bound (``calibration_seconds``): three forwards
(``probe_forwards``) size a ``Plan`` that fits it, timing fewer row counts
(the rest interpolated) and fewer passes where the full grid would not fit,
and no pass starts (or goes on) past it. The curve is checked for
plausibility (``implausibility``: passes that disagree far beyond noise, a
step over fewer rows costing far more than one over more, a cost growing far
faster than the rows) and measured again while time is left; one that still
looks wrong comes out repaired (``repair``). On the CPU every route
(lookahead/model/routing.py) is timed (``measure_routes``), and what other
processes kept the cores busy with meanwhile is counted (``others_busy``).
Keeping the curve and saying what was measured: store.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import psutil
import torch
from numpy.typing import ArrayLike

from ..model.fewrows import routable_linears
from ..model.machine import LOAD_SPAN_S, cpu_name, cpu_snapshot, others_busy  # noqa: F401 (where callers find them)
from ..model.mask import PastSlots
from ..model.quantized import embedding_facts
from ..model.routing import Route, Routing, candidate_routes, kernel_applies, onednn_applies, route_mode
from ..model.support import AttentionLayout
from ..model.switches import ForwardSwitches
from ..model.target import Target, input_device, row_argmax

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MIN_PASSES = 3  # measuring stops once this many passes in a row agree ...
AGREE = 1.25  # ... every row count's slowest within this factor of its fastest
SPREAD_LIMIT = 3.0  # slowest / fastest pass at one row count beyond this: the passes disagree
DIP_LIMIT = 3.0  # fewer rows costing more than this times more rows is no CPU dip: a disturbance
# (fewer rows can measure well over 1x more rows again and again on a loaded CPU: hence a generous limit)
GROWTH_LIMIT = 1.5  # from one grid point to the next the cost grows at most this times the rows
ROUNDING = 1 + 1e-9  # a repaired curve sits exactly at the limits
ATTEMPTS = 3  # measurements of one curve at most (the first and two retries) ...
MEASURE_CAP_S = 20.0  # ... and a retry only when it should end within this many seconds of the start (the
# default of measure_curve and measure_routes called alone; the engine passes calibration_seconds' bound)
NEAR_LAST = 1.25  # a coarser grid drops a row count within this factor of the largest (32 beside 33)


# ---------------------------------------------------------------- plausibility
def implausibility(rows: ArrayLike, times: ArrayLike) -> str | None:
    """Why a measured curve cannot be what steps cost, or None when it looks plausible.

    times [P, S] holds P passes over the row counts rows [S] (with one pass only
    the shape is checked). Flagged: a row count whose passes disagree far beyond
    noise (the second slowest over SPREAD_LIMIT times the fastest: one stray
    pass is forgiven, the median ignores it); a size costing over DIP_LIMIT
    times a larger one (the median curve; a CPU's dips, e.g. 16 rows a few
    percent faster than 12, pass); a cost growing from one grid point to the
    next over GROWTH_LIMIT times as fast as the rows (a forward's work grows
    at most about linearly in its rows).
    """
    rows = np.asarray(rows, dtype=np.float64)  # [S]
    times = np.asarray(times, dtype=np.float64).reshape(-1, rows.shape[0])  # [P, S]
    if not (np.isfinite(times).all() and (times > 0).all()):
        return "a pass took no time"
    ordered = np.sort(times, axis=0)  # [P, S]
    if ordered.shape[0] >= 2:
        spread = ordered[-2 if ordered.shape[0] >= 3 else -1] / ordered[0]  # [S]
        worst = int(np.argmax(spread))
        if spread[worst] > SPREAD_LIMIT:
            return f"passes over {rows[worst]:.0f} rows took from {short_duration(ordered[0, worst])} to " \
                   f"{short_duration(ordered[-1, worst])}"
    seconds = np.median(times, axis=0)  # [S]
    if rows.shape[0] < 2:
        return None
    cheapest_after = np.minimum.accumulate(seconds[::-1])[::-1][1:]  # [S-1] least cost at more rows
    dip = seconds[:-1] / cheapest_after  # [S-1]
    if dip.max() > DIP_LIMIT * ROUNDING:
        small = int(np.argmax(dip))
        large = small + 1 + int(np.argmin(seconds[small + 1:]))
        return f"{rows[small]:.0f} rows took {dip[small]:.1f}x as long as {rows[large]:.0f} rows"
    growth = (seconds[1:] / seconds[:-1]) / (rows[1:] / rows[:-1])  # [S-1]
    if growth.max() > GROWTH_LIMIT * ROUNDING:
        at = int(np.argmax(growth))
        return f"from {rows[at]:.0f} to {rows[at + 1]:.0f} rows the time grew " \
               f"{seconds[at + 1] / seconds[at]:.1f}x"
    return None


def repair(rows: ArrayLike, seconds: ArrayLike) -> np.ndarray:
    """A plausible curve [S] near an implausible one, for this run only (never cached).

    No size may cost more than a larger one (a spike drops to the cheapest
    larger size) nor grow faster than GROWTH_LIMIT times the rows; where the
    measurement erred, the curve errs cheap, so the budget tries those sizes
    and their real step times correct it.
    """
    rows = np.asarray(rows, dtype=np.float64)  # [S]
    fixed = np.minimum.accumulate(np.asarray(seconds, dtype=np.float64)[::-1])[::-1].copy()  # [S]
    for at in range(1, fixed.shape[0]):
        fixed[at] = min(fixed[at], fixed[at - 1] * GROWTH_LIMIT * rows[at] / rows[at - 1])
    return fixed


def short_duration(seconds: float) -> str:
    """A short duration for a message (here and in store.py's): '21 ms', '1.3 ms', '4.5 s'."""
    if seconds >= 1.0:
        return f"{seconds:.1f} s"
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"


# ---------------------------------------------------------------- passes
def passes_agree(times: np.ndarray) -> bool:
    """Whether at every row count the slowest of these passes [P, S] is within AGREE of the fastest."""
    return bool((times.max(axis=0) <= AGREE * times.min(axis=0)).all())


def time_passes(time_one: Callable[[int], float], rows: tuple[int, ...], passes: int,
                deadline: float = float("inf"), clock: Callable[[], float] = time.perf_counter,
                whole_first: bool = True) -> np.ndarray:
    """[P, S] seconds of time_one(rows[s]) in pass p, P <= passes (P >= 1 with ``whole_first``).

    Each pass times every row count once, ascending and descending in turn,
    so a burst of load elsewhere lands on one pass, not on one row count.
    Stops early once the last MIN_PASSES passes agree, or at ``deadline`` (a
    clock() value): a pass is not begun when one as long as the last would
    end past it, and one that runs past it is dropped unfinished. With
    ``whole_first`` the first pass always runs to its end (a curve needs one).
    """
    times: list[list[float]] = []
    last = 0.0  # seconds the last pass took
    for index in range(passes):
        began = clock()
        bounded = bool(times) or not whole_first
        if bounded and began + last >= deadline:
            break
        order = rows if index % 2 == 0 else rows[::-1]
        took: dict[int, float] = {}
        for q in order:
            if bounded and clock() >= deadline:
                break
            took[q] = time_one(q)
        if len(took) < len(rows):
            break
        times.append([took[q] for q in rows])
        last = clock() - began
        if agreed(np.array(times)):  # [P, S]
            break
    return np.array(times).reshape(-1, len(rows))


def agreed(times: np.ndarray) -> bool:
    """Whether the last MIN_PASSES of these passes [P, S] agree (what ends a measurement early)."""
    return times.shape[0] >= MIN_PASSES and passes_agree(times[-MIN_PASSES:])


@dataclass
class Measurement:
    """A measured curve: seconds [S], why it looks wrong (None: plausible), passes and tries it took, the
    seconds it took, and whether its deadline stopped the passes before MIN_PASSES agreed (``cut``)."""

    seconds: np.ndarray  # [S]
    problem: str | None
    passes: int
    tries: int
    elapsed: float
    cut: bool = False


def measure_curve(time_one: Callable[[int], float], rows: tuple[int, ...], repeats: int,
                  cap_s: float = MEASURE_CAP_S, clock: Callable[[], float] = time.perf_counter,
                  fallback: np.ndarray | None = None) -> Measurement:
    """Measure the curve (time_passes) until it looks plausible, ATTEMPTS times at most.

    A retry starts only when it should end within cap_s of the start (the
    last try's duration is the guess), and no try runs passes past cap_s,
    but for the first try's first pass where no ``fallback`` [S] is given
    (a curve needs one); with one, a deadline that leaves no pass gives it.
    A plausible try gives the median of its passes; if none is, the fastest
    time seen at each size (load only ever adds time), repaired.
    """
    start = clock()
    tried: list[np.ndarray] = []  # [P, S] arrays of the implausible tries
    problem = None
    cut = False
    for _ in range(ATTEMPTS):
        began = clock()
        times = time_passes(time_one, rows, repeats, start + cap_s, clock,
                            whole_first=fallback is None and not tried)  # [P, S]
        cut = cut or (times.shape[0] < repeats and not agreed(times))
        if times.shape[0] == 0:  # the deadline left no pass
            break
        problem = implausibility(rows, times)
        if problem is None:
            return Measurement(np.median(times, axis=0), None, sum(t.shape[0] for t in tried) + times.shape[0],
                               len(tried) + 1, clock() - start, cut)
        tried.append(times)
        now = clock()
        if now + (now - began) > start + cap_s:
            break
    if not tried and fallback is not None:
        problem = implausibility(rows, fallback[None])
        return Measurement(fallback if problem is None else repair(rows, fallback), problem, 0, 1,
                           clock() - start, True)
    every = np.concatenate(tried)  # [P_all, S]
    return Measurement(repair(rows, every.min(axis=0)), problem, every.shape[0], len(tried), clock() - start, cut)


# ---------------------------------------------------------------- fitting a time bound
@dataclass(frozen=True)
class Plan:
    """What of a measurement fits its time bound: the row counts timed (the grid's others are
    interpolated), the most passes per route, the seconds it should likely take and at most (both from
    now), whether that fits the time left, and what was given up for it (said after measuring)."""

    rows: tuple[int, ...]
    passes: int
    likely: float
    longest: float
    fits: bool
    cuts: tuple[str, ...] = field(default=())


def coarser_grids(rows: tuple[int, ...]) -> list[tuple[int, ...]]:
    """``rows``, then ever coarser subsets of it for a measurement short of time, each with rows' first and
    last: the row counts at powers of 2, at powers of 4, then the two ends alone (a count within NEAR_LAST
    of the last is dropped from the coarser ones).

    (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 33) -> itself, (1, 2, 4, 8, 16, 33), (1, 4, 16, 33), (1, 33).
    """
    grids = [rows]
    for base in (2, 4, 0):
        keep = {q for q in rows if base and _power_of(q, base) and q * NEAR_LAST < rows[-1]}
        grid = tuple(sorted(keep | {rows[0], rows[-1]}))
        if grid != grids[-1]:
            grids.append(grid)
    return grids


def _power_of(q: int, base: int) -> bool:
    """Whether q is a power of base (1 is base ** 0)."""
    while q % base == 0:
        q //= base
    return q == 1


# (grid of coarser_grids, most passes: None = calibration_repeats), most wanted first
PLAN_STEPS = ((0, None), (1, None), (1, 2), (2, 2), (2, 1), (3, 1))


def plan_measurement(rows: tuple[int, ...], routes: list, repeats: int, forwards: tuple[float, float],
                     left: float) -> Plan:
    """The most of the measurement that should fit in ``left`` seconds.

    ``forwards``: seconds of one forward over rows[0] and over rows[-1] rows
    (``probe_forwards``), a forward in between priced by the line through
    them. A measurement likely takes one pass over every route (with more
    than one) and MIN_PASSES passes of the fastest (they agree), at most
    ``repeats`` passes of every route. Tried in the order of PLAN_STEPS:
    the whole grid; coarser grids (``coarser_grids``); fewer passes than
    MIN_PASSES. When even the least does not fit, the least (fits False).
    """
    first = len(routes) if len(routes) > 1 else 0  # passes of the first round, over every route

    def option(grid: tuple[int, ...], passes: int) -> Plan:
        one = float(np.interp(grid, (rows[0], rows[-1]), forwards).sum()) if len(rows) > 1 else \
            forwards[0] * len(grid)  # seconds of one pass over the grid
        likely = (first + min(MIN_PASSES, passes)) * one
        longest = min((first + len(routes) * passes) * one, max(left, likely))
        cuts = []
        if grid != rows:
            cuts.append(f"timed {len(grid)} of {len(rows)} row counts ({', '.join(map(str, grid))}; "
                        f"the others interpolated)")
        if passes < min(MIN_PASSES, repeats):
            cuts.append(f"ran {passes} pass{'es' if passes > 1 else ''} per row count (not {MIN_PASSES} that agree)")
        return Plan(grid, passes, likely, longest, likely <= left, tuple(cuts))

    grids = coarser_grids(rows)
    plans = [option(grids[min(g, len(grids) - 1)], repeats if p is None else min(p, repeats)) for g, p in PLAN_STEPS]
    return next((plan for plan in plans if plan.fits), plans[-1])


def probe_forwards(time_one: Callable[[int, Route | None], float], rows: tuple[int, ...],
                   routes: list) -> tuple[float, float]:
    """Seconds of one forward over rows[0] and over rows[-1] rows through the first route, after one
    untimed warm-up at the largest (first-call allocations, kernels): what ``plan_measurement`` sizes a
    measurement by."""
    time_one(rows[-1], routes[0])  # warm-up
    return time_one(rows[0], routes[0]), time_one(rows[-1], routes[0])


def interpolated(rows: tuple[int, ...], measured: tuple[int, ...], seconds: ArrayLike) -> np.ndarray:
    """Curves [..., S'] measured at the row counts ``measured`` (a subset of ``rows``), on every row count of
    ``rows`` [..., S]: linear between the measured ones, as CostModel prices steps between grid points."""
    seconds = np.asarray(seconds, dtype=np.float64)
    if tuple(measured) == tuple(rows):
        return seconds
    flat = seconds.reshape(-1, len(measured))
    full = np.array([np.interp(rows, measured, curve) for curve in flat])  # [N, S]
    return full.reshape(seconds.shape[:-1] + (len(rows),))


# ---------------------------------------------------------------- one decode-shaped forward
class MeasurementStopped(Exception):
    """A measurement's ``stop`` said True: it ended before its next forward, nothing kept (cost/store.py)."""


PREFILL_CHUNK = 64  # synthetic context columns prefilled a forward where a measurement may be stopped


def decode_step_timer(model: PreTrainedModel, layout: AttentionLayout, context: int, seed: int = 0,
                      batch: int = 1, switches: ForwardSwitches | None = None,
                      stop: Callable[[], bool] | None = None) -> StepTimer:
    """time_one(q, route): seconds of one decode-shaped forward over q new rows after ``context``
    cached ones, run through ``route`` (model/routing.py; None: as torch is set).

    Each pass goes through ``Target.step`` exactly as a decode step does
    (for a batch of ``batch`` sequences of q tokens too), plus
    the step's host sync (an argmax read back), and is cropped away again. A
    synthetic context of random tokens is prefilled here, once (with ``stop``, PREFILL_CHUNK columns a
    forward, ``stop`` asked before each: MeasurementStopped where it says True). ``switches``: the target's
    (model/switches.py); with ``traced`` it replays its steps from TorchScript traces (model/traced.py),
    each kind traced on its first step (``StepTimer``).
    """
    return StepTimer(model, layout, context, seed, batch, switches, stop)


class StepTimer:
    """``decode_step_timer``'s timer: ``self(q, route)`` times one step; ``target`` is the Target it steps,
    whose ``last_route`` says how the latest step ran ("kernel x2", "kernel x2 traced", ...)."""

    def __init__(self, model: PreTrainedModel, layout: AttentionLayout, context: int, seed: int = 0,
                 batch: int = 1, switches: ForwardSwitches | None = None, stop: Callable[[], bool] | None = None):
        switches = switches or ForwardSwitches()
        self.target = Target(model, layout, switches)
        if switches.traced:
            self.target.long_lived()  # every kind traced on its first step
        self.traced = switches.traced
        self.context, self.batch = context, batch
        self.rng = np.random.default_rng(seed)
        self.cache = self.target.new_cache()
        prefix = self.rng.integers(0, self.target.vocab, (batch, context), dtype=np.int64)  # [B, C]
        step = context if stop is None else PREFILL_CHUNK  # (one forward where nothing may stop it)
        with torch.inference_mode():
            for start in range(0, context, step):
                if stop is not None and stop():
                    raise MeasurementStopped("the measurement was stopped while it prefilled its context")
                model(input_ids=torch.from_numpy(prefix[:, start:start + step]).to(self.target.device),
                      use_cache=True, logits_to_keep=1, **{self.target.cache_keyword: self.cache})
        self.passes: dict[int, Callable] = {}  # q -> the step function over fixed random tokens [B, q]

    def __call__(self, q: int, route: Route | None = None) -> float:
        if q not in self.passes:
            tokens = self.rng.integers(0, self.target.vocab, (self.batch, q), dtype=np.int64)
            self.passes[q] = _step_pass(self.target, tokens, self.context)
        mode: AbstractContextManager[None]
        if self.traced:
            # A traced step takes its route from the target's routing (the route is an input of the
            # trace's linear op): one route measured, so it is the only one ever chosen.
            self.target.routings = {self.batch: Routing(np.array([q]), [route], np.ones((1, 1)))} \
                if route is not None else {}
            mode = nullcontext()
        else:
            mode = route_mode(route, self.batch * q, self.target.linears)
        with torch.inference_mode(), mode:
            took = self._timed(q)
            if self.target.compile_seconds > 0.0:  # it made a trace or captured a graph: timed again, as steps run
                took = self._timed(q)
        return took

    def _timed(self, q: int) -> float:
        """Seconds of one step over q rows, read back to the host; the cache as it was before."""
        began = time.perf_counter()
        logits = self.passes[q](self.cache)  # [B, q, V]
        row_argmax(logits.reshape(-1, logits.shape[-1])).cpu()  # the step's host sync, read as the loop reads it
        took = time.perf_counter() - began
        self.cache.crop(-q)
        return took


def _step_pass(target: Target, tokens: np.ndarray, context: int):
    """A function cache -> logits running one causal step over tokens [B, q] after ``context`` slots, as
    decode/loop.py runs a step (several sequences carry their cache slots' bookkeeping: model/mask.py)."""
    batch, q = tokens.shape
    offsets = np.arange(q, dtype=np.int64)  # [q]
    positions = np.repeat((context + offsets)[None], batch, axis=0)  # [B, q] (writable: torch takes it)
    local = np.repeat(np.tril(np.ones((q, q), dtype=bool))[None], batch, axis=0)  # [B, q, q]
    slots = None
    if batch > 1:
        dev = target.device
        slots = PastSlots(torch.ones(batch, context, dtype=torch.bool, device=dev),
                          torch.arange(context, device=dev)[None].expand(batch, -1))  # [B, C] each
    return lambda cache: target.step(cache, tokens, positions, local, offsets, context, slots)


def measure_forward_seconds(model: PreTrainedModel, layout: AttentionLayout, rows: tuple[int, ...], context: int,
                            repeats: int, seed: int = 0, batch: int = 1, route: Route | None = None) -> list[float]:
    """Median seconds of one decode-shaped forward over q new rows through ``route``, for every q in rows.

    ``repeats`` interleaved passes (decode_step_timer, time_passes; fewer once
    MIN_PASSES agree) after one untimed warm-up pass at the largest q. No
    plausibility check: benchmarks/costcurve.py reports what it measures.
    """
    time_one = decode_step_timer(model, layout, context, seed, batch)
    time_one(rows[-1], route)  # warm-up
    return np.median(time_passes(lambda q: time_one(q, route), rows, repeats), axis=0).tolist()


# ---------------------------------------------------------------- routes
PRUNE = 1.25  # a route over this times the fastest at every row count after one pass is measured no further
HOPELESS = 3.0  # ... and one over this times the fastest at one row count is not even timed at the others


def measured_routes(model: PreTrainedModel, few_row_matmul: bool, onednn: bool = False) -> list:
    """The routes a forward of this model is measured through: on the CPU torch's threads and one,
    through torch's linear, (``onednn``) oneDNN's over packed weights (float32, where a packed copy of
    the linears fits in a third of the free memory) and (``few_row_matmul``) lookahead's; elsewhere [None]
    (as set). A model whose linear layers are all quantized (none a route reroutes) is measured at each
    thread count once."""
    device, dtype = input_device(model), embedding_facts(model)[1]
    if device.type != "cpu":
        return [None]
    linears = routable_linears(model)
    if onednn:  # (its packed copy must fit)
        weight_bytes = sum(layer.weight.numel() * layer.weight.element_size() for layer in linears)
        onednn = onednn_applies(device, dtype, weight_bytes, int(psutil.virtual_memory().available))
    return candidate_routes(torch.get_num_threads(), few_row_matmul and kernel_applies(device, dtype), onednn,
                            rerouted=bool(linears))


def first_pass(time_one: Callable[[int, Route | None], float], rows: tuple[int, ...], routes: list) -> np.ndarray:
    """[R, S] one forward per route and row count, row counts ascending, every route at one row count
    before the next. A route HOPELESS times slower than the fastest at a row count is timed no further
    (a 2-thread forward beside a busy core can take seconds): its later points are the fastest route's
    times that factor slower."""
    first = np.zeros((len(routes), len(rows)))  # [R, S]
    alive, dropped = list(range(len(routes))), {}  # dropped: route -> (row count index, factor)
    for s, q in enumerate(rows):
        for i in alive:
            first[i, s] = time_one(q, routes[i])
        best = min(first[i, s] for i in alive)
        for i in [i for i in alive if first[i, s] > HOPELESS * best]:
            alive.remove(i)
            dropped[i] = (s, first[i, s] / best)
    fastest = first[alive].min(axis=0)  # [S]
    for i, (s, factor) in dropped.items():
        first[i, s + 1:] = factor * fastest[s + 1:]
    return first


def _through(time_one: Callable[[int, Route | None], float], route: Route | None) -> Callable[[int], float]:
    """``time_one`` with its route fixed: seconds of one forward over q rows through ``route``."""
    return lambda q: time_one(q, route)


def measure_routes(time_one: Callable[[int, Route | None], float], rows: tuple[int, ...], routes: list,
                   repeats: int, cap_s: float = MEASURE_CAP_S,
                   clock: Callable[[], float] = time.perf_counter) -> tuple[np.ndarray, Measurement]:
    """(seconds [R, S] of every route, the measurement of the fastest at each row count), within cap_s.

    One pass through every route first (``first_pass``); a route PRUNE times
    slower than the fastest at every row count keeps that pass as its curve,
    the others are measured to the end (measure_curve), each in an equal
    share of the time left; where none is left, the first pass is their
    curve too (the Measurement says ``cut``).
    """
    start = clock()
    first = first_pass(time_one, rows, routes) if len(routes) > 1 else np.zeros((0, len(rows)))  # [R, S]
    kept = [i for i in range(len(routes)) if first.shape[0] == 0 or (first[i] <= PRUNE * first.min(axis=0)).any()]
    seconds = first.copy() if first.shape[0] else np.zeros((len(routes), len(rows)))
    parts = []
    for n, i in enumerate(kept):
        share = max(0.0, start + cap_s - clock()) / (len(kept) - n)
        part = measure_curve(_through(time_one, routes[i]), rows, repeats, share, clock,
                             fallback=first[i] if first.shape[0] else None)
        seconds[i] = part.seconds
        parts.append(part)
    best = seconds.min(axis=0)  # [S]
    problem = next((p.problem for p in parts if p.problem is not None), None) or implausibility(rows, best[None])
    passes = min(first.shape[0], 1) + sum(p.passes for p in parts)
    return seconds, Measurement(best if problem is None else repair(rows, best), problem, passes,
                                max(p.tries for p in parts), clock() - start, any(p.cut for p in parts))
