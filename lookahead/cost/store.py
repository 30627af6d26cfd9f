"""Where a cost curve is kept between runs, and what measuring one says to the user.

``load_cost_model`` reads the curve of this model, device, dtype, CPU and
thread count from the disk cache (``CurveStore``, keyed by
``model_fingerprint``), or measures it (measure.py), within its time bound,
and stores it. A plausible curve is cached; one that still looks wrong is
not: this run starts from a repaired copy. One measured while other
processes kept the CPU busy is used but not cached either (the next run
measures again), unless ``keep_busy``. A line on stderr says what is
measured and for about how long (``announcement``), another what came out,
what the time bound made it give up, and whether and where it is kept
(``outcome``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from ..config import LookaheadConfig
from ..loading.models import ALIASES
from ..model.hugepages import on_huge_pages
from ..model.quantized import embedding_facts, weights_summary
from ..model.routing import Routing
from ..model.support import AttentionLayout
from ..model.switches import ForwardSwitches
from ..model.target import input_device
from ..native.build import load_linear, sources_digest, tiled_width
from .curve import TRUST_MEASURED, TRUST_REPAIRED, CostModel, row_grid
from .disk import CurveStore
from .measure import (
    MIN_PASSES,
    Measurement,
    MeasurementStopped,
    Plan,
    cpu_name,
    cpu_snapshot,
    decode_step_timer,
    interpolated,
    measure_routes,
    measured_routes,
    others_busy,
    plan_measurement,
    probe_forwards,
    short_duration,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

LOAD_LIMIT = 0.25  # other processes keeping this many cores busy while measuring: the curve is not cached
# in cost curves' fingerprints: a change to the routes or kernels re-measures (5: tiled kernel; 6: fused traces,
# the tiled kernel's spread prefetch, curves of traced steps; 7: the C++ op's attention kernel; 8: the tiled
# kernel in 16 lanes where AVX-512F runs and measures faster, its width in the fingerprint; W @ x^T from one row;
# 9: the 16-lane tiled kernel's seven to nine rows in one pass; 10: the attention op by each row's visible keys,
# integer products a K super-block at a time; 11: a GGUF model's traces fused as a float model's are, its
# weight buffers on the huge pages; 12: the timed steps' logits read by numpy's argmax as the decode loop reads them)
ROUTES_VERSION = 12
KEY_DIGITS = 24  # hex digits of the fingerprint's sha256 that name its file: 96 bits, no collision in practice
SPREAD_SAID = 1.5  # the announcement gives the longest a measurement may take when it is this many times the likely
BOUND_S = float(LookaheadConfig.calibration_seconds)  # the default bound on one measurement's wall-clock seconds
KEEP_BUSY = LookaheadConfig.keep_busy_curve  # by default a curve measured under load is not cached

Say = Callable[[str], None]


def say_on_stderr(line: str) -> None:
    """One line for the user on stderr (the default reporter of a measurement)."""
    print(line, file=sys.stderr, flush=True)


def cached_cost_model(model: PreTrainedModel, layout: AttentionLayout, max_rows: int, context: int, repeats: int,
                      cache_dir: str, batch: int = 1, switches: ForwardSwitches | None = None) -> CostModel | None:
    """The curve ``load_cost_model`` would read from the disk cache with these arguments, or None where the
    cache holds none: nothing is measured (an open batch's first step of a new size does not wait for one)."""
    return _cost_model(model, layout, max_rows, context, repeats, cache_dir, batch, switches=switches,
                       cached_only=True)


def load_cost_model(model: PreTrainedModel, layout: AttentionLayout, max_rows: int, context: int, repeats: int,
                    cache_dir: str, batch: int = 1, say: Say = say_on_stderr, switches: ForwardSwitches | None = None,
                    bound_s: float = BOUND_S, keep_busy: bool = KEEP_BUSY, fresh: bool = False,
                    clock: Callable[[], float] = time.perf_counter,
                    stop: Callable[[], bool] | None = None) -> CostModel:
    """The cached curve for this model/device/dtype/CPU/threads (and batch size); measured when absent
    (or ``fresh``: measured whatever the cache holds, and written over it).

    On the CPU the curve is measured through every route (``measured_routes``)
    and its ``routing`` says which one each row count runs through. The whole
    measurement, the synthetic context's prefill included, keeps to
    ``bound_s`` seconds on ``clock``: three forwards (``probe_forwards``) size
    a plan that fits (``plan_measurement``: fewer row counts, the others
    interpolated, or fewer passes), and no pass runs past it. A measurement
    says so through ``say`` (a line on stderr): what is measured and for
    about how long, then the curve, the routes, what the bound cut, and
    whether and where it is kept. A plausible curve measured while the
    machine was otherwise quiet (or with ``keep_busy``) is saved at once and
    again, refined, after CONFIRM_STEPS real steps; an implausible one
    (``measure_curve``), or one measured while other processes kept
    LOAD_LIMIT cores busy, is used for this run and not saved as measured.
    ``cache_dir`` "" measures without reading or writing the disk. ``switches`` (model/switches.py; default
    ForwardSwitches()): the forwards run as a generator with the same config fields runs them and are
    measured so: ``graphs``, one sequence's steps on a CUDA device as CUDA graphs (model/graphs.py);
    ``native``, the C++ op and its tiled kernel (model/fewrows.py), and ``attention``, their grouped-query
    attention through that op's kernel; ``few_row_matmul`` and ``onednn``, the routes tried; ``traced``, on
    the CPU, the steps replayed from a trace (model/traced.py), so the curve has their shape (an eager
    step's fixed Python costs made more rows look cheaper relative to one than they are traced: `lookahead
    roofline` times both); making the trace is part of the measurement's time. ``stop`` (None: never) is
    asked before every timed forward: where it says True the measurement ends at once, nothing kept, and
    ``MeasurementStopped`` is raised (a server measuring while idle, whose requests came back).
    """
    curve = _cost_model(model, layout, max_rows, context, repeats, cache_dir, batch, say, switches, bound_s,
                        keep_busy, fresh, clock, stop=stop)
    assert curve is not None, "measured where the cache holds none"
    return curve


def _cost_model(model: PreTrainedModel, layout: AttentionLayout, max_rows: int, context: int, repeats: int,
                cache_dir: str, batch: int = 1, say: Say = say_on_stderr, switches: ForwardSwitches | None = None,
                bound_s: float = BOUND_S, keep_busy: bool = KEEP_BUSY, fresh: bool = False,
                clock: Callable[[], float] = time.perf_counter, cached_only: bool = False,
                stop: Callable[[], bool] | None = None) -> CostModel | None:
    """``load_cost_model``, or with ``cached_only`` ``cached_cost_model``."""
    switches = switches or ForwardSwitches()
    native, attention = switches.native, switches.attention
    rows = row_grid(max_rows)
    routes = measured_routes(model, switches.few_row_matmul, switches.onednn)
    fingerprint = model_fingerprint(model, rows, context, repeats, routes)
    fingerprint["native_linear"] = native
    fingerprint["native_attention"] = native and attention
    if native and input_device(model).type == "cpu":
        load_linear()  # (where not loaded yet: the forwards measured load it next)
        fingerprint["tiled_lanes"] = tiled_width()  # (products summed in another width: another curve)
        fingerprint["native_sources"] = sources_digest()  # (another build's kernels: another curve)
    if on_huge_pages(model):
        fingerprint["huge_pages"] = True  # (weights streamed from 2 MB pages: a faster curve)
    if switches.heap and input_device(model).type == "cpu":
        fingerprint["kept_heap"] = True  # (intermediates on pages already touched: a faster curve)
    if batch > 1:
        fingerprint["batch"] = batch
    graphed = switches.graphs and batch == 1 and input_device(model).type == "cuda"  # steps replayed as graphs
    if graphed:
        fingerprint["graphs"] = True
    replayed = switches.traced and input_device(model).type == "cpu"  # steps replayed from a trace
    if replayed:
        fingerprint["traced"] = True
    store = None
    if cache_dir:
        key = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:KEY_DIGITS]
        store = CurveStore(os.path.join(os.path.expanduser(cache_dir), f"{key}.json"), fingerprint)
        saved = store.read() if not fresh else None
        if saved is not None:
            return CostModel(np.array(rows, dtype=np.float64), np.array(saved[0], dtype=np.float64),
                             routing=_routing(rows, routes, saved[1]), cached=store.path)
    if cached_only:
        return None
    if stop is not None and stop():
        raise MeasurementStopped(f"the step cost of a batch of {batch} was not measured: work arrived")
    started, before = clock(), cpu_snapshot()
    # (prefills the synthetic context; with ``stop``, in pieces it may stop between)
    try:
        timer = decode_step_timer(model, layout, context, batch=batch,
                                  switches=dataclasses.replace(switches, graphs=graphed, traced=replayed), stop=stop)
    except MeasurementStopped:
        say(_stopped_line(batch))
        raise
    time_one: Callable[[int, Any], float] = timer if stop is None else _stoppable(timer, stop, batch, say)
    forwards = probe_forwards(time_one, rows, routes)
    plan = plan_measurement(rows, routes, repeats, forwards, started + bound_s - clock())
    say(announcement(fingerprint, rows, (clock() - started + plan.likely, clock() - started + plan.longest),
                     store, bound=(bound_s, plan.fits), keep_busy=keep_busy))
    every, measured = measure_routes(time_one, plan.rows, routes, plan.passes, started + bound_s - clock(), clock)
    busy = others_busy(before, cpu_snapshot())
    every = interpolated(rows, plan.rows, every)  # [R, S]
    measured = dataclasses.replace(measured, seconds=interpolated(rows, plan.rows, measured.seconds),
                                   elapsed=clock() - started)
    routing = _routing(rows, routes, every)
    wrong = measured.problem is not None
    keeping = busy < LOAD_LIMIT or keep_busy
    unwritten = None
    if store is not None and keeping and not wrong:
        unwritten = store.save(measured.seconds.tolist(), every.tolist(),
                               about(measured, plan, busy, bound_s))
    say(outcome(fingerprint, rows, measured, store, routing, busy, unwritten,
                cuts=bound_cuts(plan, measured), bound_s=bound_s, keep_busy=keep_busy))
    cached = store.path if store is not None and keeping and not wrong and unwritten is None else None
    return CostModel(np.array(rows, dtype=np.float64), measured.seconds, routing=routing, repaired=wrong,
                     store=store if keeping else None, trust=TRUST_REPAIRED if wrong else TRUST_MEASURED,
                     cached=cached)


def _stoppable(time_one: Callable[[int, Any], float], stop: Callable[[], bool], batch: int,
               say: Say) -> Callable[[int, Any], float]:
    """``time_one`` asking ``stop`` before every forward (MeasurementStopped where it says True, said on ``say``)."""
    def timed(rows: int, route: Any) -> float:
        if stop():
            say(_stopped_line(batch))
            raise MeasurementStopped(f"the step cost of a batch of {batch} was not measured: work arrived")
        return time_one(rows, route)

    return timed


def _stopped_line(batch: int) -> str:
    """What a stopped measurement says."""
    return (f"lookahead: the step-cost measurement{f' of a batch of {batch}' if batch > 1 else ''} stopped: "
            f"requests arrived; it is measured again when the server is next idle")


def bound_cuts(plan: Plan, measured: Measurement) -> tuple[str, ...]:
    """What the time bound made a measurement give up: the plan's cuts, and passes it stopped (where the
    plan had more than one)."""
    stopped = (f"stopped its passes at the bound before {MIN_PASSES} agreed",) if measured.cut and plan.passes > 1 \
        else ()
    return plan.cuts + stopped


def about(measured: Measurement, plan: Plan, busy: float, bound_s: float) -> dict:
    """How a cached curve was measured, saved beside it (``lookahead costs list`` shows it)."""
    return {"measured_s": round(measured.elapsed, 2), "bound_s": bound_s, "busy_cores": round(busy, 2),
            "rows_timed": list(plan.rows), "passes": measured.passes, "cuts": list(bound_cuts(plan, measured))}


def _routing(rows: tuple[int, ...], routes: list, seconds: ArrayLike) -> Routing | None:
    """The Routing over these routes' curves [R][S] (None off the CPU, where forwards run as set)."""
    return Routing(np.array(rows), routes, np.array(seconds)) if routes != [None] else None


def model_fingerprint(model: PreTrainedModel, rows: tuple[int, ...], context: int, repeats: int,
                      routes: list | tuple = ()) -> dict:
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
                   "dtype": str(embedding_facts(model)[1]), "weights": weights_summary(model), "device": name,
                   "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": list(rows),
                   "context": context, "repeats": repeats,
                   "cpu": cpu_name(), "routes": [r.label if r is not None else "as set" for r in routes],
                   "routes_version": ROUTES_VERSION}
    placement = {module: str(where) for module, where in (getattr(model, "hf_device_map", None) or {}).items()}
    if len(set(placement.values())) > 1:
        fingerprint["device_map"] = placement
    return fingerprint


# ---------------------------------------------------------------- what is said
def announcement(fingerprint: dict, rows: tuple[int, ...], estimate: tuple[float, float],
                 store: CurveStore | None, bound: tuple[float, bool] = (BOUND_S, True),
                 keep_busy: bool = KEEP_BUSY) -> str:
    """The line said before measuring: what, on what, for about how long (``estimate``: likely and longest
    seconds; ``bound``: the time bound and whether the plan fits it), and where it is kept on which terms."""
    name = model_name(fingerprint) if fingerprint["name_or_path"] else fingerprint["model_type"]
    batch = f", batch of {fingerprint['batch']}" if "batch" in fingerprint else ""
    likely, longest = estimate
    limit, fits = bound
    if not fits:
        duration = f"about {_s(likely)}, over the {_s(limit)} bound (calibration_seconds): it cannot be measured " \
                   f"in less"
    else:
        duration = f"about {_s(likely)}" + (f" (up to {_s(longest)})" if longest > SPREAD_SAID * likely else "")
    if store is None:
        kept = "not kept: cost_cache_dir is empty"
    elif keep_busy:
        kept = f"then kept in {os.path.dirname(store.path)} if it looks right"
    else:
        kept = f"then kept in {os.path.dirname(store.path)} if it looks right and the CPU stays otherwise idle"
    return (f"lookahead: measuring the step cost of {name} on {fingerprint['device']} "
            f"({fingerprint['dtype'].removeprefix('torch.')}, {_count(fingerprint['threads'], 'thread')}{batch}) "
            f"over {rows[0]} to {rows[-1]} rows: {duration}; {kept}")


def outcome(fingerprint: dict, rows: tuple[int, ...], measured: Measurement, store: CurveStore | None,
            routing: Routing | None = None, busy: float = 0.0, unwritten: str | None = None,
            cuts: tuple[str, ...] = (), bound_s: float = BOUND_S, keep_busy: bool = KEEP_BUSY) -> str:
    """The line said after measuring: the curve in brief, the routes chosen, what the time bound cut
    (``cuts``), and where it is kept, or why not and how to keep one (``unwritten``: why the store could
    not be written)."""
    tries = f", {measured.tries} tries" if measured.tries > 1 else ""
    done = f"lookahead: step cost measured in {_s(measured.elapsed)} ({_count(measured.passes, 'pass')}{tries})"
    routes = f"; {routing.summary()}" if routing is not None and len(routing.routes) > 1 else ""
    said = f"{', '.join(cuts[:-1])} and {cuts[-1]}" if len(cuts) > 1 else "".join(cuts)
    bounded = f"; to keep within {_s(bound_s)} (calibration_seconds) it {said}" if cuts else ""
    if measured.problem is not None:
        why = "is another process busy on this machine?"
        if fingerprint["device"] == "cpu" and fingerprint["threads"] > 1:
            why += " (on a shared CPU, fewer threads - --threads 1 or torch.set_num_threads(1) - can be much faster)"
        later = "caches it once they make it look right (else the next run measures again)" \
            if store is not None and (busy < LOAD_LIMIT or keep_busy) else "the next run measures again"
        return (f"{done} looks wrong ({measured.problem}; {why}){bounded}: not cached; this run starts from a "
                f"repaired curve{routes} and refines it from its own steps; {later}")
    summary = f"{done}: {curve_summary(rows, measured.seconds)}{routes}{bounded}"
    if busy >= LOAD_LIMIT:
        load = f"other processes kept {busy:.1f} of {os.cpu_count()} cores busy meanwhile"
        if store is not None and keep_busy and unwritten is None:
            return f"{summary}; {load}: cached anyway (keep_busy_curve) in {store.path}"
        if store is not None and not keep_busy:
            return (f"{summary}; {load}, so it is used for this run only and not cached: the next run measures "
                    f"again. To keep it, pass --keep-busy-curve (keep_busy_curve=True), or run `lookahead costs "
                    f"measure --model {model_name(fingerprint)}` while the machine is idle")
    if store is None:
        return f"{summary}; not cached (cost_cache_dir is empty): every run measures again"
    if unwritten is not None:
        return (f"{summary}; not cached: {os.path.dirname(store.path)} cannot be written ({unwritten}); pass a "
                f"writable --cost-cache-dir DIR (cost_cache_dir), or '' to measure every run without caching")
    return f"{summary}; cached in {store.path}"


def model_name(fingerprint: dict) -> str:
    """What ``--model`` names this fingerprint's model by: the alias whose directory lookahead built, else its
    name or path as loaded ('NAME' for a model loaded without one)."""
    name = fingerprint["name_or_path"]
    parent, base = os.path.split(os.path.normpath(name)) if name else ("", "")
    if base in ALIASES and os.path.basename(parent) == "models":
        return base
    return name or "NAME"


def curve_summary(rows: tuple[int, ...], seconds: np.ndarray) -> str:
    """The first point and a few more relative to it, e.g. '1 row 20 ms, 8 rows 1.5x, 32 rows 3.0x'."""
    picks = sorted({int(round(i)) for i in np.linspace(0, len(rows) - 1, min(len(rows), 4))})
    parts = [f"{rows[0]} row{'s' if rows[0] > 1 else ''} {short_duration(seconds[0])}"]
    parts += [f"{rows[i]} rows {seconds[i] / seconds[0]:.1f}x" for i in picks[1:]]
    return ", ".join(parts)


def _s(seconds: float) -> str:
    """A longer duration for a message: '0.4 s', '5 s', '96 s' (never '0.0 s')."""
    return f"{max(seconds, 0.1):.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def _count(number: int, noun: str) -> str:
    """'1 thread', '2 threads', '3 passes'."""
    return f"{number} {noun}{'' if number == 1 else 'es' if noun.endswith('s') else 's'}"
