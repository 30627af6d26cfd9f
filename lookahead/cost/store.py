"""Where a cost curve is kept between runs, and what measuring one says to the user.

``load_cost_model`` reads the curve of this model, device, dtype, CPU and
thread count from the disk cache (``CurveStore``, keyed by
``model_fingerprint``), or measures it (measure.py) and stores it. A
plausible curve is cached; one that still looks wrong is not: this run
starts from a repaired copy. One measured while other processes kept the
CPU busy is used but not cached either. A line on stderr says what is
measured and for about how long (``announcement``), another what came out
(``outcome``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from numpy.typing import ArrayLike

from ..model.routing import Routing
from ..model.support import AttentionLayout
from ..model.target import input_device
from .curve import TRUST_MEASURED, TRUST_REPAIRED, CostModel, row_grid
from .disk import CurveStore
from .measure import (
    Measurement,
    cpu_name,
    cpu_snapshot,
    decode_step_timer,
    estimate_seconds,
    measure_routes,
    measured_routes,
    others_busy,
    short_duration,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

LOAD_LIMIT = 0.25  # other processes keeping this many cores busy while measuring: the curve is not cached
ROUTES_VERSION = 3  # in cost curves' fingerprints: a change to the routes or kernels re-measures
KEY_DIGITS = 24  # hex digits of the fingerprint's sha256 that name its file: 96 bits, no collision in practice
SPREAD_SAID = 1.5  # the announcement gives the longest a measurement may take when it is this many times the likely

Say = Callable[[str], None]


def say_on_stderr(line: str) -> None:
    """One line for the user on stderr (the default reporter of a measurement)."""
    print(line, file=sys.stderr, flush=True)


def load_cost_model(model: PreTrainedModel, layout: AttentionLayout, max_rows: int, context: int, repeats: int,
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
        key = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:KEY_DIGITS]
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
    unwritten = store.save(measured.seconds.tolist(), every.tolist()) if keep and store is not None else None
    say(outcome(fingerprint, rows, measured, store, routing, busy, unwritten))
    return CostModel(np.array(rows, dtype=np.float64), measured.seconds, routing=routing, repaired=wrong,
                     store=store if busy < LOAD_LIMIT else None, trust=TRUST_REPAIRED if wrong else TRUST_MEASURED)


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
                   "dtype": str(model.get_input_embeddings().weight.dtype), "device": name,
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
                 store: CurveStore | None) -> str:
    """The line said before measuring: what, on what, for about how long, and whether it is kept."""
    name = fingerprint["name_or_path"] or fingerprint["model_type"]
    batch = f", batch of {fingerprint['batch']}" if "batch" in fingerprint else ""
    likely, longest = estimate
    duration = f"about {_s(likely)}" + (f" (up to {_s(longest)})" if longest > SPREAD_SAID * likely else "")
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
