"""What one decode step over q rows costs on this model, device and dtype.

Measured once, the first time a model is decoded with the adaptive budget:
passes over the grid of row counts up to the largest step, each pass timing
one decode-shaped forward per row count (explicit positions, a 4-D mask,
logits only for the kept rows, the host sync) after a synthetic context. The
passes are interleaved, so a burst of load elsewhere on the machine hits one
pass rather than one row count, and measuring stops once three passes agree.
The curve is checked for plausibility (``implausibility``: passes that
disagree far beyond noise, a step over fewer rows costing far more than one
over more, a cost growing far faster than the rows) and measured again a
bounded number of times, within a time cap. A plausible curve is cached on
disk per model, device, dtype and thread count; one that still looks wrong
is not: this run starts from a repaired copy (``repair``). A line on stderr
says what is measured and for about how long, another what came out.

While decoding, every step's time refines the curve (``CostModel.observe``):
the grid points around its row count learn what steps there really take, and
what they agree on rescales every size, tried or not. A curve measured under
load thus converges to what steps cost; a curve measured in this process is
written back to the cache once CONFIRM_STEPS real steps have refined it and
it looks plausible (a cached curve is never rewritten by a later process).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

import platform

import psutil

from ..model.routing import Route, Routing, candidate_routes, kernel_applies, route_mode
from ..model.support import AttentionLayout
from ..model.target import Target, input_device

GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
MIN_PASSES = 3  # measuring stops once this many passes in a row agree ...
AGREE = 1.25  # ... every row count's slowest within this factor of its fastest
SPREAD_LIMIT = 3.0  # slowest / fastest pass at one row count beyond this: the passes disagree
DIP_LIMIT = 3.0  # fewer rows costing more than this times more rows is no CPU dip: a disturbance
# (Qwen2.5-Coder-1.5B on a 2-core CPU: 3 rows measured 1.6x as long as 8 rows, again and again)
GROWTH_LIMIT = 1.5  # from one grid point to the next the cost grows at most this times the rows
ATTEMPTS = 3  # measurements of one curve at most (the first and two retries) ...
MEASURE_CAP_S = 30.0  # ... and a retry only when it should end within this many seconds of the start
TRUST_MEASURED = 4.0  # a plausible measured point weighs as much as this many observed steps
TRUST_REPAIRED = 0.25  # ... a point of an implausible (repaired) curve
ROUNDING = 1 + 1e-9  # a repaired curve sits exactly at the limits
CONFIRM_STEPS = 64  # steps observed before a curve measured in this process is written back
RATIO_LIMIT = 100.0  # a step counts as at most this factor off the starting curve
PRUNE = 1.25  # a route over this times the fastest at every row count after one pass is measured no further
HOPELESS = 3.0  # ... and one over this times the fastest at one row count is not even timed at the others
LOAD_LIMIT = 0.25  # other processes keeping this many cores busy while measuring: the curve is not cached
LOAD_SPAN_S = 0.25  # ... counted over at least this long (a shorter measurement is taken as quiet)
ROUTES_VERSION = 2  # in cost curves' fingerprints: a change to the routes or kernels re-measures

Say = Callable[[str], None]


def say_on_stderr(line: str) -> None:
    """One line for the user on stderr (the default reporter of a measurement)."""
    print(line, file=sys.stderr, flush=True)


def row_grid(max_rows: int) -> tuple[int, ...]:
    """Row counts measured for a step of at most max_rows rows."""
    return tuple(sorted({q for q in GRID if q < max_rows} | {max_rows}))


@dataclass(frozen=True)
class CurveStore:
    """Where a curve is cached on disk: the file, and the fingerprint it is saved under."""

    path: str
    fingerprint: dict

    def read(self) -> tuple[list[float], list[list[float]]] | None:
        """The saved seconds [S] and every route's [R][S], or None (missing, foreign, corrupt or
        implausible file)."""
        return _read(self.path, self.fingerprint)

    def save(self, seconds: list[float], routes: list[list[float]]) -> str | None:
        """Save the seconds atomically; None when written, else why not (a read-only or full disk only
        costs a measurement next time)."""
        return _write(self.path, self.fingerprint, seconds, routes)


@dataclass
class CostModel:
    """Seconds of one decode step over q rows: a measured curve, refined by the steps that ran.

    Between grid points the curve is interpolated, past the last one
    extended along its last segment. ``observe`` refines it from the time
    real steps take; ``smoothing`` 0 keeps it as given.
    """

    rows: np.ndarray  # [S] increasing row counts
    seconds: np.ndarray  # [S] seconds of a step over rows[s]: the starting curve, refined in place
    smoothing: float = 0.1  # the least weight of the newest step in a grid point's mean (0: never refine)
    trust: float = TRUST_MEASURED  # how many observed steps a starting point weighs as much as
    store: CurveStore | None = None  # where the refined curve goes once confirmed (measured in this process)
    repaired: bool = False  # the start is a repaired implausible measurement: kept only once steps covered it
    routing: Routing | None = None  # how forwards run on this CPU (routing.py), saved beside the curve
    # The curve is kept as measured, dips included: on CPUs a matrix product over 16 rows
    # can be faster than over 12 (seen on SmolLM2 and Qwen2.5-1.5B here), and the budget
    # should use that. Noise is fought with the median of several passes instead, and a
    # disturbance far beyond a dip is caught by ``implausibility`` before the curve is kept.
    start: np.ndarray = field(init=False, repr=False)  # [S] the curve as it began (measured or read)
    seen: np.ndarray = field(init=False, repr=False)  # [S] steps observed at each point (interpolation weight)
    mean: np.ndarray = field(init=False, repr=False)  # [S] running mean of log(taken / start) there
    shrink: np.ndarray = field(init=False, repr=False)  # [S] scratch: seen / (trust + seen)
    work: np.ndarray = field(init=False, repr=False)  # [S] scratch
    scale: float = field(init=False, default=1.0)  # what every size is off by (load slows all alike)
    steps: int = field(init=False, default=0)  # steps observed

    def __post_init__(self) -> None:
        self.rows = np.asarray(self.rows, dtype=np.float64)
        self.seconds = np.array(self.seconds, dtype=np.float64)  # own copy: refined in place
        self.start = self.seconds.copy()
        self.seen, self.mean, self.shrink, self.work = (np.zeros_like(self.seconds) for _ in range(4))

    def step(self, q: np.ndarray) -> np.ndarray:
        """Expected seconds of a decode step with q rows (interpolated; linear past the last point)."""
        return np.maximum(_extend(self.rows, self.seconds, q), 1e-9)

    def observe(self, q: int, seconds: float) -> None:
        """A step over q rows took ``seconds``: refine the curve.

        The (at most two) grid points that interpolate q add log(taken /
        start) to their running means, weighted by their interpolation
        weight; the newest step weighs at least ``smoothing``, so the means
        follow a machine that gets busier or quieter. The curve is then
        start * exp(level + shape), a shrinkage estimate (``refined_log``):
        each point believes its own mean in proportion to seen / (trust +
        seen), and what the points agree on (the level) moves every size,
        tried or not, so a curve measured under load is rescaled everywhere
        and a bad point is corrected where steps run. A few floats and a few
        in-place operations on [S] per call; no device work. A pass over more rows
        than the curve spans (a draft catching up on a whole prompt) says nothing about
        the steps it prices, and is ignored.
        """
        if self.smoothing <= 0 or q > self.rows[-1]:
            return
        lo, hi, upper = _bracket(self.rows, q)  # q = rows[lo] + upper * (rows[hi] - rows[lo])
        start = (1.0 - upper) * self.start[lo] + upper * self.start[hi]
        taken = math.log(min(max(seconds / start, 1.0 / RATIO_LIMIT), RATIO_LIMIT))
        for point, weight in ((lo, 1.0 - upper), (hi, upper)):
            if weight > 0.0:
                self.seen[point] += weight
                rate = max(weight / self.seen[point], weight * self.smoothing)
                self.mean[point] += rate * (taken - self.mean[point])
        self.steps += 1
        level = refined_log(self.seen, self.mean, self.trust, self.steps, self.shrink, self.work)  # work: [S]
        self.scale = math.exp(level)
        np.exp(self.work, out=self.work)
        np.multiply(self.start, self.work, out=self.seconds)
        if self.store is not None and self.steps % CONFIRM_STEPS == 0:
            self.write_back()

    def write_back(self) -> bool:
        """Save the refined curve where it was measured, once, if it looks plausible; whether it was saved.

        A repaired start is a guess wherever no step ran: such a curve is kept
        only once real steps ran at (or around) every grid point.
        """
        if self.store is None or (self.repaired and (self.seen < 1.0).any()) \
                or implausibility(self.rows, self.seconds[None]) is not None:
            return False
        self.store.save(self.seconds.tolist(), route_seconds(self.routing, self.seconds))
        self.store = None
        return True


def _extend(rows: np.ndarray, seconds: np.ndarray, q) -> np.ndarray:
    """seconds at q: interpolated between rows, extended along the last segment (never down) past them."""
    q = np.asarray(q, dtype=np.float64)
    inside = np.interp(q, rows, seconds)
    if rows.shape[0] < 2:
        return inside
    slope = max(seconds[-1] - seconds[-2], 0.0) / max(rows[-1] - rows[-2], 1)
    return np.where(q > rows[-1], seconds[-1] + slope * (q - rows[-1]), inside)


def refined_log(seen: np.ndarray, mean: np.ndarray, trust: float, steps: int, shrink: np.ndarray,
                out: np.ndarray) -> float:
    """log(refined / start) at every grid point into out [S]; returns the level (the part all sizes share).

    A point with ``seen`` steps whose log ratios average ``mean`` believes
    them in proportion shrink = seen / (trust + seen), the rest it takes from
    the level: out = level + shrink * (mean - level). The level is the
    shrink-weighted mean of the points' means, believed in proportion
    1 - exp(-steps / trust): one step hitting a burst moves a trusted curve
    only a little, a few dozen steps move it all the way. shrink is scratch.
    """
    np.add(seen, trust, out=out)
    np.divide(seen, out, out=shrink)
    weight = float(shrink.sum())
    level = float(np.dot(shrink, mean)) / weight * (1.0 - math.exp(-steps / trust)) if weight > 0 else 0.0
    np.subtract(mean, level, out=out)
    out *= shrink
    out += level
    return level


def _bracket(rows: np.ndarray, q: float) -> tuple[int, int, float]:
    """(lo, hi, upper): the grid points around q and hi's interpolation weight (clamped at both ends)."""
    hi = int(np.searchsorted(rows, q))
    if hi == 0:
        return 0, 0, 0.0
    if hi >= rows.shape[0]:
        return hi - 1, hi - 1, 0.0
    lo = hi - 1
    return lo, hi, float((q - rows[lo]) / (rows[hi] - rows[lo]))


# ---------------------------------------------------------------- plausibility
def implausibility(rows, times) -> str | None:
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
            return f"passes over {rows[worst]:.0f} rows took from {_ms(ordered[0, worst])} to " \
                   f"{_ms(ordered[-1, worst])}"
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


def repair(rows, seconds) -> np.ndarray:
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


# ---------------------------------------------------------------- measuring
def passes_agree(times: np.ndarray) -> bool:
    """Whether at every row count the slowest of these passes [P, S] is within AGREE of the fastest."""
    return bool((times.max(axis=0) <= AGREE * times.min(axis=0)).all())


def time_passes(time_one: Callable[[int], float], rows: tuple[int, ...], passes: int,
                deadline: float = float("inf"), clock: Callable[[], float] = time.perf_counter) -> np.ndarray:
    """[P, S] seconds of time_one(rows[s]) in pass p, 1 <= P <= passes.

    Each pass times every row count once, ascending and descending in turn,
    so a burst of load elsewhere lands on one pass, not on one row count.
    Stops early once the last MIN_PASSES passes agree, or after the pass
    that ends past ``deadline`` (a clock() value).
    """
    times: list[list[float]] = []
    for index in range(passes):
        order = rows if index % 2 == 0 else rows[::-1]
        took = {q: time_one(q) for q in order}
        times.append([took[q] for q in rows])
        recent = np.array(times[-MIN_PASSES:])  # [<= MIN_PASSES, S]
        if (recent.shape[0] == MIN_PASSES and passes_agree(recent)) or clock() > deadline:
            break
    return np.array(times)


@dataclass
class Measurement:
    """A measured curve: seconds [S], why it looks wrong (None: plausible), passes and tries it took."""

    seconds: np.ndarray  # [S]
    problem: str | None
    passes: int
    tries: int
    elapsed: float


def measure_curve(time_one: Callable[[int], float], rows: tuple[int, ...], repeats: int,
                  cap_s: float = MEASURE_CAP_S, clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Measure the curve (time_passes) until it looks plausible, ATTEMPTS times at most.

    A retry starts only when it should end within cap_s of the start (the
    last try's duration is the guess), and no try runs passes past cap_s.
    A plausible try gives the median of its passes; if none is, the fastest
    time seen at each size (load only ever adds time), repaired.
    """
    start = clock()
    tried = []  # [P, S] arrays of the implausible tries
    problem = None
    for _ in range(ATTEMPTS):
        began = clock()
        times = time_passes(time_one, rows, repeats, start + cap_s, clock)  # [P, S]
        problem = implausibility(rows, times)
        if problem is None:
            return Measurement(np.median(times, axis=0), None, sum(t.shape[0] for t in tried) + times.shape[0],
                               len(tried) + 1, clock() - start)
        tried.append(times)
        now = clock()
        if now + (now - began) > start + cap_s:
            break
    every = np.concatenate(tried)  # [P_all, S]
    return Measurement(repair(rows, every.min(axis=0)), problem, every.shape[0], len(tried), clock() - start)


def route_seconds(routing: Routing | None, seconds: np.ndarray) -> list[list[float]]:
    """What is saved of the routes: every route's measured curve [R][S] (one route, the curve, without)."""
    return routing.seconds.tolist() if routing is not None else [list(map(float, seconds))]


def decode_step_timer(model, layout: AttentionLayout, context: int, seed: int = 0,
                      batch: int = 1) -> Callable[[int, Route | None], float]:
    """time_one(q, route): seconds of one decode-shaped forward over q new rows after ``context``
    cached ones, run through ``route`` (routing.py; None: as torch is set).

    Each pass goes through ``Target.forward`` exactly as a decode step does
    (``Target.forward_batch`` for a batch of ``batch`` rows of q tokens), plus
    the step's host sync (an argmax read back), and is cropped away again. A
    synthetic context of random tokens is prefilled here, once.
    """
    target = Target(model, layout)
    rng = np.random.default_rng(seed)
    cache = target.new_cache()
    prefix = rng.integers(0, target.vocab, (batch, context), dtype=np.int64)  # [B, C]
    with torch.inference_mode():
        model(input_ids=torch.from_numpy(prefix).to(target.device), past_key_values=cache, use_cache=True,
              logits_to_keep=1)
    passes = {}  # q -> the step function over fixed random tokens [B, q]

    def time_one(q: int, route: Route | None = None) -> float:
        if q not in passes:
            passes[q] = _step_pass(target, rng.integers(0, target.vocab, (batch, q), dtype=np.int64), context)
        with torch.inference_mode(), route_mode(route, batch * q):
            began = time.perf_counter()
            passes[q](cache).argmax(-1).cpu()  # the step's host sync
            took = time.perf_counter() - began
            cache.crop(-q)
        return took

    return time_one


def measure_forward_seconds(model, layout: AttentionLayout, rows: tuple[int, ...], context: int,
                            repeats: int, seed: int = 0, batch: int = 1, route: Route | None = None) -> list[float]:
    """Median seconds of one decode-shaped forward over q new rows through ``route``, for every q in rows.

    ``repeats`` interleaved passes (decode_step_timer, time_passes; fewer once
    MIN_PASSES agree) after one untimed warm-up pass at the largest q. No
    plausibility check: benchmarks/costcurve.py reports what it measures.
    """
    time_one = decode_step_timer(model, layout, context, seed, batch)
    time_one(rows[-1], route)  # warm-up
    return np.median(time_passes(lambda q: time_one(q, route), rows, repeats), axis=0).tolist()


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


def measure_routes(time_one: Callable[[int, Route | None], float], rows: tuple[int, ...], routes: list,
                   repeats: int, cap_s: float = MEASURE_CAP_S,
                   clock: Callable[[], float] = time.perf_counter) -> tuple[np.ndarray, Measurement]:
    """(seconds [R, S] of every route, the measurement of the fastest at each row count).

    One pass through every route first (``first_pass``); a route PRUNE times
    slower than the fastest at every row count keeps that pass as its curve,
    the others are measured to the end (measure_curve, sharing the time cap).
    """
    start = clock()
    first = first_pass(time_one, rows, routes) if len(routes) > 1 else np.zeros((0, len(rows)))  # [R, S]
    kept = [i for i in range(len(routes)) if first.shape[0] == 0 or (first[i] <= PRUNE * first.min(axis=0)).any()]
    seconds = first.copy() if first.shape[0] else np.zeros((len(routes), len(rows)))
    parts = []
    for i in kept:
        part = measure_curve(lambda q, r=routes[i]: time_one(q, r), rows, repeats, cap_s / len(kept), clock)
        seconds[i] = part.seconds
        parts.append(part)
    best = seconds.min(axis=0)  # [S]
    problem = next((p.problem for p in parts if p.problem is not None), None) or implausibility(rows, best[None])
    passes = min(first.shape[0], 1) + sum(p.passes for p in parts)
    return seconds, Measurement(best if problem is None else repair(rows, best), problem, passes,
                                max(p.tries for p in parts), clock() - start)


def cpu_name() -> str:
    """The CPU's model name ('AMD EPYC', 'Intel(R) Xeon(R) ...'), or the machine type where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_snapshot() -> tuple[float, float, float]:
    """(a clock, seconds all CPUs have been busy, seconds this process has run): for ``others_busy``."""
    total = psutil.cpu_times()
    guest = getattr(total, "guest", 0.0) + getattr(total, "guest_nice", 0.0)  # already counted in user
    busy = sum(total) - total.idle - getattr(total, "iowait", 0.0) - guest
    own = psutil.Process().cpu_times()
    return time.monotonic(), busy, own.user + own.system


def others_busy(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """How many cores other processes (or other machines sharing this one) kept busy between two snapshots."""
    wall = after[0] - before[0]  # (CPU times tick every 10 ms: a shorter span cannot tell)
    return max(0.0, (after[1] - before[1]) - (after[2] - before[2])) / wall if wall >= LOAD_SPAN_S else 0.0


def _step_pass(target: Target, tokens: np.ndarray, context: int):
    """A function cache -> logits running one causal step over tokens [B, q] after ``context`` slots."""
    batch, q = tokens.shape
    offsets = np.arange(q, dtype=np.int64)  # [q]
    local = np.tril(np.ones((q, q), dtype=bool))  # [q, q]
    if batch == 1:
        return lambda cache: target.forward(cache, tokens[0], offsets, local, context, offsets)
    dev = target.device
    tokens_t = torch.from_numpy(tokens).to(dev)  # [B, q]
    q_pos = torch.from_numpy(context + offsets).to(dev)[None].expand(batch, -1)  # [B, q]
    visible = torch.cat([torch.ones(batch, q, context, dtype=torch.bool, device=dev),
                         torch.from_numpy(local).to(dev)[None].expand(batch, -1, -1)], dim=2)  # [B, q, C+q]
    k_pos = torch.cat([torch.arange(context, device=dev)[None].expand(batch, -1), q_pos], dim=1)  # [B, C+q]
    return lambda cache: target.forward_batch(cache, tokens_t, q_pos, visible, k_pos)


# ---------------------------------------------------------------- the cached curve
def model_fingerprint(model, rows: tuple[int, ...], context: int, repeats: int, routes: list = ()) -> dict:
    """What the measured curve depends on.

    The device is where the inputs go (target.input_device: with a device_map
    the first parameter may be offloaded to "meta"); a device_map that places
    modules on more than one device (several GPUs, CPU or disk offload) is part
    of the fingerprint, since it changes the cost of every forward. So are the
    CPU's model name and torch's thread count: nothing measured on one machine
    is used on another.
    """
    device = input_device(model)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    fingerprint = {"name_or_path": str(getattr(model.config, "_name_or_path", "")),
                   "model_type": str(getattr(model.config, "model_type", type(model).__name__)),
                   "parameters": int(sum(p.numel() for p in model.parameters())),
                   "dtype": str(model.get_input_embeddings().weight.dtype), "device": name,
                   "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": list(rows),
                   "context": context, "repeats": repeats,
                   "cpu": cpu_name(), "routes": [r.label if r is not None else "as set" for r in routes],
                   "routes_version": ROUTES_VERSION}
    placement = {module: str(where) for module, where in (getattr(model, "hf_device_map", None) or {}).items()}
    if len(set(placement.values())) > 1:
        fingerprint["device_map"] = placement
    return fingerprint


def flat_curve(curve: CostModel) -> CostModel:
    """A curve where every step costs what ``curve``'s one-row step costs, never refined:
    what the budget does where rows are free (a GPU at batch 1), on any machine."""
    return CostModel(curve.rows.copy(), np.full_like(curve.seconds, float(curve.step(np.array([1.0]))[0])),
                     smoothing=0.0)


def measured_routes(model, few_row_matmul: bool) -> list:
    """The routes a forward of this model is measured through: on the CPU torch's threads and one,
    through torch's linear and (``few_row_matmul``) lookahead's; elsewhere [None] (as set)."""
    device, dtype = input_device(model), model.get_input_embeddings().weight.dtype
    if device.type != "cpu":
        return [None]
    return candidate_routes(torch.get_num_threads(), few_row_matmul and kernel_applies(device, dtype))


def load_cost_model(model, layout: AttentionLayout, max_rows: int, context: int, repeats: int,
                    cache_dir: str, batch: int = 1, say: Say = say_on_stderr,
                    few_row_matmul: bool = True) -> CostModel:
    """The cached curve for this model/device/dtype/CPU/threads (and batch size); measured when absent.

    On the CPU the curve is measured through every route (``measured_routes``)
    and its ``routing`` says which one each row count runs through. A
    measurement says so through ``say`` (a line on stderr): what is measured
    and for about how long, then the curve, the routes and where it is kept. A
    plausible curve measured while the machine was otherwise quiet is saved at
    once and again, refined, after CONFIRM_STEPS real steps; an implausible one
    (``measure_curve``), or one measured while other processes kept
    LOAD_LIMIT cores busy, is used for this run and not saved as measured.
    ``cache_dir`` "" measures without reading or writing the disk.
    """
    rows = row_grid(max_rows)
    routes = measured_routes(model, few_row_matmul)
    fingerprint = model_fingerprint(model, rows, context, repeats, routes)
    if batch > 1:
        fingerprint["batch"] = batch
    store = None
    if cache_dir:
        key = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:24]
        store = CurveStore(os.path.join(os.path.expanduser(cache_dir), f"{key}.json"), fingerprint)
        saved = store.read()
        if saved is not None:
            return CostModel(np.array(rows, dtype=np.float64), np.array(saved[0], dtype=np.float64),
                             routing=_routing(rows, routes, saved[1]))
    time_one = decode_step_timer(model, layout, context, batch=batch)
    say(announcement(fingerprint, rows, estimate_seconds(time_one, rows, repeats, routes), store))
    before = cpu_snapshot()
    every, measured = measure_routes(time_one, rows, routes, repeats)
    busy = others_busy(before, cpu_snapshot())
    routing = _routing(rows, routes, every)
    wrong = measured.problem is not None
    keep = store is not None and not wrong and busy < LOAD_LIMIT
    unwritten = store.save(measured.seconds.tolist(), every.tolist()) if keep else None
    say(outcome(fingerprint, rows, measured, store, routing, busy, unwritten))
    return CostModel(np.array(rows, dtype=np.float64), measured.seconds, routing=routing, repaired=wrong,
                     store=store if busy < LOAD_LIMIT else None, trust=TRUST_REPAIRED if wrong else TRUST_MEASURED)


def _routing(rows: tuple[int, ...], routes: list, seconds) -> Routing | None:
    """The Routing over these routes' curves [R][S] (None off the CPU, where forwards run as set)."""
    return Routing(np.array(rows), routes, np.array(seconds)) if routes != [None] else None


def estimate_seconds(time_one: Callable[[int, Route | None], float], rows: tuple[int, ...], repeats: int,
                     routes: list) -> tuple[float, float]:
    """(likely, longest) seconds measure_routes should take, from three forwards.

    One untimed warm-up at the largest size, then one timed forward at the
    smallest and at the largest (the first route); a pass costs their mean at
    every grid point. Likely: one pass per route, then MIN_PASSES passes of
    one (they agree); longest: every pass of every route; both no more
    passes than fit in the time cap, plus the one that crosses it.
    """
    time_one(rows[-1], routes[0])  # warm-up (first-call allocations, kernels)
    per_pass = len(rows) * (time_one(rows[0], routes[0]) + time_one(rows[-1], routes[0])) / 2
    within_cap = max(1, math.ceil(MEASURE_CAP_S / per_pass)) if per_pass > 0 else repeats  # passes
    first = len(routes) if len(routes) > 1 else 0
    likely = first + min(MIN_PASSES, repeats, within_cap)  # usually one route is measured on
    return likely * per_pass, (first + min(len(routes) * repeats, within_cap)) * per_pass


def announcement(fingerprint: dict, rows: tuple[int, ...], estimate: tuple[float, float],
                 store: CurveStore | None) -> str:
    """The line said before measuring: what, on what, for about how long, and whether it is kept."""
    name = fingerprint["name_or_path"] or fingerprint["model_type"]
    batch = f", batch of {fingerprint['batch']}" if "batch" in fingerprint else ""
    likely, longest = estimate
    duration = f"about {_s(likely)}" + (f" (up to {_s(longest)})" if longest > 1.5 * likely else "")
    kept = f"once, then read from {os.path.dirname(store.path)}" if store is not None else \
        "not kept: cost_cache_dir is empty"
    return (f"lookahead: measuring the step cost of {name} on {fingerprint['device']} "
            f"({fingerprint['dtype'].removeprefix('torch.')}, {_count(fingerprint['threads'], 'thread')}{batch}) "
            f"over {rows[0]} to {rows[-1]} rows: {duration}, {kept}")


def outcome(fingerprint: dict, rows: tuple[int, ...], measured: Measurement, store: CurveStore | None,
            routing: Routing | None = None, busy: float = 0.0, unwritten: str | None = None) -> str:
    """The line said after measuring: the curve in brief, the routes chosen and where it is kept (or why not:
    ``unwritten``, why the store could not be written)."""
    tries = f", {measured.tries} tries" if measured.tries > 1 else ""
    done = f"lookahead: step cost measured in {_s(measured.elapsed)} ({_count(measured.passes, 'pass')}{tries})"
    routes = f"; {routing.summary()}" if routing is not None and len(routing.routes) > 1 else ""
    if measured.problem is not None:
        why = "is another process busy on this machine?"
        if fingerprint["device"] == "cpu" and fingerprint["threads"] > 1:
            why += " (on a shared CPU, fewer threads - --threads 1 or torch.set_num_threads(1) - can be much faster)"
        return (f"{done} looks wrong ({measured.problem}; {why}): not cached; this run starts from a "
                f"repaired curve{routes}, refines it from its own steps and caches it only once it looks right")
    summary = f"{done}: {curve_summary(rows, measured.seconds)}{routes}"
    if busy >= LOAD_LIMIT:
        return (f"{summary}; other processes kept {busy:.1f} of {os.cpu_count()} cores busy meanwhile, so it is "
                f"used for this run and not cached (the steps re-check it)")
    if store is None:
        return f"{summary}; not cached"
    if unwritten is not None:
        return (f"{summary}; not cached: {os.path.dirname(store.path)} cannot be written ({unwritten}); pass a "
                f"writable --cost-cache-dir DIR (cost_cache_dir), or '' to measure every run without caching")
    return f"{summary}; cached in {store.path}"


def curve_summary(rows: tuple[int, ...], seconds: np.ndarray) -> str:
    """'1 row 21 ms, 8 rows 1.5x, 33 rows 2.8x': the first point and a few more relative to it."""
    picks = sorted({int(round(i)) for i in np.linspace(0, len(rows) - 1, min(len(rows), 4))})
    parts = [f"{rows[0]} row{'s' if rows[0] > 1 else ''} {_ms(seconds[0])}"]
    parts += [f"{rows[i]} rows {seconds[i] / seconds[0]:.1f}x" for i in picks[1:]]
    return ", ".join(parts)


def _ms(seconds: float) -> str:
    """A short duration for a message: '21 ms', '1.3 ms', '4.5 s'."""
    if seconds >= 1.0:
        return f"{seconds:.1f} s"
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"


def _s(seconds: float) -> str:
    """A longer duration for a message: '0.4 s', '5 s', '96 s' (never '0.0 s')."""
    return f"{max(seconds, 0.1):.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def _count(number: int, noun: str) -> str:
    """'1 thread', '2 threads', '3 passes'."""
    return f"{number} {noun}{'' if number == 1 else 'es' if noun.endswith('s') else 's'}"


def _read(path: str, fingerprint: dict) -> tuple[list[float], list[list[float]]] | None:
    """Saved seconds [S] and route curves [R][S] for exactly this fingerprint, or None (missing, foreign,
    corrupt or implausible file: a curve cached before plausibility was checked is measured again)."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint:
        return None
    seconds, routes = data.get("seconds"), data.get("routes")
    size = len(fingerprint["rows"])
    if not _positive_floats(seconds, size) or not isinstance(routes, list) \
            or len(routes) != len(fingerprint["routes"]) or not all(_positive_floats(r, size) for r in routes):
        return None
    if implausibility(fingerprint["rows"], [seconds]) is not None:
        return None
    return seconds, routes


def _positive_floats(values, size: int) -> bool:
    """Whether values is a list of ``size`` positive floats."""
    return isinstance(values, list) and len(values) == size and all(isinstance(v, float) and v > 0 for v in values)


def _write(path: str, fingerprint: dict, seconds: list[float], routes: list[list[float]]) -> str | None:
    """Save atomically; None when written, else why not (a read-only or full disk only costs a
    re-measurement next time)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as handle:
            json.dump({"fingerprint": fingerprint, "seconds": seconds, "routes": routes}, handle)
        os.replace(tmp, path)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
