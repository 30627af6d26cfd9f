"""How a forward over few rows runs on this CPU: on how many threads, and through whose linear kernel.

Which is fastest depends on the machine and on what else runs on it: lookahead's few-row
kernel (kernels/linear.py) beats torch's own on some CPUs and loses on others, and with
another process busy on one of the cores a forward on every thread waits at each parallel
region for the thread that shares a core with it, many times slower than on one thread
(`lookahead bench --busy-cores 1` measures it; results/RESULTS.md keeps what it measured). So nothing
here is a default: the cost measurement (cost/measure.py) times a decode-shaped
forward over every row count through every ``Route`` (``candidate_routes``),
``Routing`` keeps, per row count, the route that was fastest, and the decode
loop re-checks that choice while it runs:

- the chosen route's steps follow how much slower or faster than measured the
  machine runs now; when that moves ``RECHECK`` times from where it stood at
  the choice (the machine got busy or quiet), the fastest other route of
  each thread count (as estimated now) runs TRY_STEPS real steps and the
  choice is made again: a load moves routes apart by their threads, so the
  others of a count would only repeat what its fastest shows (trying every
  route after a drift would run each slower one's TRY_STEPS steps too, again
  at each row count and batch size: `lookahead bench --busy-cores 1` decodes
  beside such a load);
- a runner-up also runs TRY_STEPS steps on a schedule (``EXPLORE_FIRST``
  steps, doubling while it loses), so a load that ended, or one unlucky step,
  does not keep a fast route off for good.

A try is judged by the median of its steps, and takes a row count over only
when it beats the route there by SWITCH_MARGIN: two routes within noise of
each other (on a shared machine one step's time moves from the next's by more
than the margin) would otherwise trade places on every lucky step, the loser
running until the next try.

Threads are the user's: a route never runs on more threads than
``torch.get_num_threads()`` says, and a forward run on fewer puts torch's
count back when it returns (numba's too).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from .fewrows import FEW_ROWS_MAX, KERNEL_DTYPES, ONEDNN_DTYPES, FewRowLinear, onednn_available

RECHECK = 1.5  # the chosen route's steps this many times slower or faster than when chosen: try the others
EXPLORE_FIRST = 32  # steps before the runner-up route is tried again ...
EXPLORE_LAST = 512  # ... doubling each time it loses, up to this many
EXPLORE_BUSY = 64  # ... or this many while a route other than the measured fastest runs (a load may end)
SMOOTHING = 0.3  # weight of a route's newest step in its running log ratio of taken / measured
TRY_STEPS = 3  # steps a route runs when tried (its level: their median)
RECENT = 3  # a chosen route's level moves toward the median of its last RECENT steps (one stall moves nothing)
SWITCH_MARGIN = 0.05  # a tried route takes a row count over when it is this much faster (log ratio) there


# torch's F.linear; lookahead's few-row kernel; torch's W @ x^T (1-64 rows); torch's oneDNN over packed weights
LINEARS = ("torch", "kernel", "mm", "onednn")


@dataclass(frozen=True)
class Route:
    """One way to run a forward: on ``threads`` threads (at most torch's), linears through
    ``linear``: "torch" (F.linear as it is), "kernel" (lookahead's few-row kernel, fewrows.py),
    "mm" (1..64 rows as W @ x^T: torch's own kernels, through a faster path than F.linear's on some
    CPUs) or "onednn" (torch's oneDNN kernel over weights packed once, fewrows.py)."""

    threads: int
    linear: str

    @property
    def label(self) -> str:
        """'kernel x2', 'torch x1', 'mm x2'."""
        return f"{self.linear} x{self.threads}"


def median(values: list[float]) -> float:
    """The median of a few values, in plain Python (called every step; a numpy call's fixed cost would
    exceed the work on so few values):
    [3, 1, 2] -> 2; [1, 4] -> 2.5."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def candidate_routes(threads: int, kernel: bool, onednn: bool = False, rerouted: bool = True) -> list[Route]:
    """The routes worth measuring with torch at ``threads`` threads: that count and one thread,
    each through every linear (lookahead's kernel only when ``kernel``, oneDNN's packed one only
    when ``onednn``); the first is torch as set. ``rerouted`` False (a model without a linear layer a
    route reroutes: every one quantized): torch's alone at each count, as the others would run the same ops.

    Worked example: (2, True) -> torch x2, kernel x2, mm x2, torch x1, kernel x1, mm x1; (2, True,
    rerouted=False) -> torch x2, torch x1."""
    counts = sorted({max(1, threads), 1}, reverse=True)
    offered = {"kernel": kernel, "onednn": onednn}
    linears = [linear for linear in LINEARS if offered.get(linear, True)] if rerouted else ["torch"]
    return [Route(t, linear) for t in counts for linear in linears]


def onednn_applies(device: torch.device, dtype: torch.dtype, weight_bytes: int, available: int) -> bool:
    """Whether the onednn route can run for a model on device in dtype (the CPU, float32, a torch built
    with oneDNN) and its packed copy of the linears' ``weight_bytes`` fits: at most a third of the
    ``available`` host memory."""
    return device.type == "cpu" and dtype in ONEDNN_DTYPES and 3 * weight_bytes <= available and onednn_available()


def kernel_applies(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether lookahead's few-row kernel can run for a model on device in dtype (the CPU, float32/64)."""
    return device.type == "cpu" and dtype in KERNEL_DTYPES


@contextmanager
def route_mode(route: Route | None, rows: int, linears: FewRowLinear | None, weights: bool = True) -> Iterator[None]:
    """Run the body (one forward over ``rows`` rows of the model whose layers ``linears`` holds)
    through ``route``; None: as torch is set.

    Fewer threads than torch's are set for the body and put back after; a
    kernel or mm route enters ``linears.routed``, which runs numba on at most
    those threads and puts numba's count back (``linears`` None: torch's linears).
    ``weights`` False: the threads alone, the layers' weights left as they are
    (a replayed trace, whose linear op is told the route: ``linears.threads``).
    """
    if route is None or rows > FEW_ROWS_MAX:
        yield
        return
    threads = torch.get_num_threads()
    fewer = route.threads < threads
    if fewer:
        torch.set_num_threads(route.threads)
    try:
        if route.linear != "torch" and linears is not None:
            with linears.routed(kernel=route.linear == "kernel", onednn=route.linear == "onednn") if weights \
                    else linears.threads():
                yield
        else:
            yield
    finally:
        if fewer:
            torch.set_num_threads(threads)


@dataclass
class Routing:
    """The route each row count runs through: measured, then re-checked by the steps that run.

    ``seconds[r, s]`` is what a forward over rows[s] rows took through
    routes[r] when measured. What a step takes now is, in logs, the machine's
    level at its row count (``common``: how much slower or faster than when
    measured everything runs, e.g. while another process shares the cores)
    plus the route's own level there (``level``: how it fares against the
    others, 0 until it ran at that row count). A row count runs the route with
    the least seconds * exp(level). The chosen route's steps follow the
    machine's level (toward the median of its last RECENT steps, so one step
    that stalled - a page fault, the collector: 8x its route's time, seen with
    four sequences - moves nothing); a tried route's steps set its own level
    (the median of its try's steps, less the machine's level). Levels are
    relative so that a spell when the whole machine ran slow, met by whichever
    route ran then, does not sink that route against routes last seen in a
    quiet spell (on a shared machine the same route's step time moves with the
    others' load within a minute). Per row count, because a route can fall behind
    at one row count and not at another (other work contends for the memory and
    the cores differently at different row counts).

    The steps re-check the choice: when the machine's level at a row count
    moves RECHECK away from where it stood when the choice was made (the
    machine got busy or quiet: routes may fare differently now, one thread
    against two), every other route runs TRY_STEPS steps; and every
    EXPLORE_FIRST steps (doubling while it loses, up to EXPLORE_LAST, or
    EXPLORE_BUSY while a load keeps the measured fastest route off) the
    runner-up runs TRY_STEPS: as measured (the route that would win if a load
    had gone) and as estimated now, in turn. Then the choice is made again,
    a route keeping a row count unless another is SWITCH_MARGIN faster there.
    """

    rows: np.ndarray  # [S] row counts measured
    routes: list[Route]
    seconds: np.ndarray  # [R, S]
    level: np.ndarray = field(init=False)  # [R, S] log(taken / measured) per route and row count, less common
    # Per row count, as plain Python lists: a step reads and writes one entry of each (numpy's scalar
    # indexing costs microseconds a call in a step's host work, which runs with the caches cold)
    common: list[float] = field(init=False)  # [S] the machine's level: log(taken / measured) of every route
    followed: list[bool] = field(init=False)  # [S] whether a chosen route's step has set ``common`` there
    choice: np.ndarray = field(init=False)  # [S] route index per row count (``choice_list``: the same, as ints)
    chosen_common: list[float] = field(init=False)  # [S] the machine's level when the choice was made
    queue: list[int] = field(init=False, default_factory=list)  # routes to try next, a step each entry
    samples: dict[tuple[int, int], list[float]] = field(init=False, default_factory=dict)  # this try's
    # log ratios per (route, grid point)
    recent: dict[tuple[int, int], list[float]] = field(init=False, default_factory=dict)  # the last RECENT
    # log ratios per (route, grid point)
    ran: int = field(init=False, default=-1)  # the route the last route_for gave
    trying: bool = field(init=False, default=False)  # ... and whether it was a try (not the row count's choice)
    since: int = field(init=False, default=0)  # steps since the runner-up was last tried
    interval: int = field(init=False, default=EXPLORE_FIRST)  # steps between tries of the runner-up
    rounds: int = field(init=False, default=0)  # re-checks started (drift or schedule)
    scheduled: int = field(init=False, default=0)  # scheduled tries of a runner-up so far

    def __post_init__(self) -> None:
        self.rows = np.asarray(self.rows, dtype=np.float64)
        self.row_list = self.rows.tolist()  # the same, for bisect (no numpy call in a step)
        self.seconds = np.asarray(self.seconds, dtype=np.float64).reshape(len(self.routes), -1)
        self.seconds_list = self.seconds.tolist()  # [R][S] the same, for a step's scalar reads
        self.level = np.zeros(self.seconds.shape)
        self.level_list = self.level.tolist()  # [R][S] the same, kept equal where level is written
        points = self.seconds.shape[1]
        self.common, self.followed, self.chosen_common = [0.0] * points, [False] * points, [0.0] * points
        self._set_choice(np.argmin(self._now(), axis=0))  # [S]

    def _set_choice(self, choice: np.ndarray) -> None:
        """The route of each row count [S], and the machine's level it was chosen at."""
        self.choice = choice
        self.choice_list = choice.tolist()
        self.chosen_common = list(self.common)

    def _now(self) -> np.ndarray:
        """[R, S] what every route should take now."""
        return self.seconds * np.exp(self.level)

    def _choose(self) -> None:
        """Each row count's route: the fastest now, unless the current one is within SWITCH_MARGIN of it."""
        now = np.log(self._now())  # [R, S]
        points = np.arange(self.choice.shape[0])
        best = np.argmin(now, axis=0)  # [S]
        stay = now[self.choice, points] <= now[best, points] + SWITCH_MARGIN
        self._set_choice(np.where(stay, self.choice, best))

    def _point(self, q: int) -> int:
        """The grid point that prices a step of q rows (the first at or above q, the last past it)."""
        return min(bisect.bisect_left(self.row_list, q), len(self.row_list) - 1)

    def route_for(self, q: int) -> Route:
        """The route a forward over q rows runs through now (a route being tried, else the chosen one)."""
        self.trying = bool(self.queue)
        self.ran = self.queue.pop(0) if self.queue else self.choice_list[self._point(q)]
        return self.routes[self.ran]

    def observe(self, q: int, seconds: float) -> None:
        """The forward route_for gave for q rows took ``seconds`` (with its read-back, as measured)."""
        r, point = self.ran, self._point(q)
        self.ran = -1
        if r < 0 or seconds <= 0 or q > self.row_list[-1]:  # (a forward over more rows than measured says little)
            return
        taken = math.log(seconds / self.seconds_list[r][point])
        recent = self.recent.setdefault((r, point), [])
        recent.append(taken)
        del recent[:-RECENT]
        chosen = self.choice_list[point]
        if r != chosen:  # a try: what the route did long ago says little now; its steps' median does
            samples = self.samples.setdefault((r, point), [])
            samples.append(taken)
            self.level[r, point] = self.level_list[r][point] = median(samples) - self.common[point]
        else:  # the machine's level, as the chosen route's last steps show it (one stalled step: nothing)
            machine = median(recent) - self.level_list[r][point]
            step = 1.0 if not self.followed[point] else SMOOTHING
            self.common[point] += step * (machine - self.common[point])
            self.followed[point] = True
        if self.queue:
            return
        if r != chosen:  # a try ended: choose again; a runner-up that lost waits longer next time
            before = self.choice.copy()
            self._choose()
            # off the measured best: a load
            fallback = self.choice_list[point] != int(np.argmin(self.seconds[:, point]))
            longest = EXPLORE_BUSY if fallback else EXPLORE_LAST  # (whose end is worth noticing soon)
            self.interval = EXPLORE_FIRST if (self.choice != before).any() else min(2 * self.interval, longest)
            return
        self.since += 1
        if abs(self.common[point] - self.chosen_common[point]) > math.log(RECHECK):
            self._recheck(self._fastest_others(r, point))
        elif self.since >= self.interval and len(self.routes) > 1:
            # The runner-up as measured (a route slowed by a load that has gone looks no better now than
            # then) and, every other time, as estimated now (one unlucky step may have sunk it).
            ahead = self.seconds[:, point] if self.scheduled % 2 == 0 else self._now()[:, point]  # [R]
            ahead = ahead.copy()
            ahead[r] = np.inf
            self.scheduled += 1
            self._recheck([int(np.argmin(ahead))])

    def _fastest_others(self, chosen: int, point: int) -> list[int]:
        """The fastest route now at ``point`` of each thread count, ``chosen`` left out, by thread count.

        Routes torch x2, kernel x2, torch x1, kernel x1 estimated 3, 2, 4, 2.5 at a point where kernel x2
        runs -> [torch x2, kernel x1]."""
        now = self._now()[:, point]  # [R]
        best: dict[int, int] = {}
        for i, route in enumerate(self.routes):
            if i != chosen and (route.threads not in best or now[i] < now[best[route.threads]]):
                best[route.threads] = i
        return [best[threads] for threads in sorted(best, reverse=True)]

    def _recheck(self, routes: list[int]) -> None:
        """Run these routes for TRY_STEPS steps each, then choose again."""
        self.queue, self.since = [r for r in routes for _ in range(TRY_STEPS)], 0
        self.samples = {}
        self.rounds += 1

    def summary(self) -> str:
        """'1-4 rows kernel x2, 6-33 rows torch x2': the choice as ranges of row counts."""
        parts, start = [], 0
        for s in range(1, self.rows.shape[0] + 1):
            if s == self.rows.shape[0] or self.choice[s] != self.choice[start]:
                low, high = int(self.rows[start]), int(self.rows[s - 1])
                span = f"{low}" if low == high else f"{low}-{high}"
                parts.append(f"{span} row{'' if span == '1' else 's'} {self.routes[int(self.choice[start])].label}")
                start = s
        return ", ".join(parts)

