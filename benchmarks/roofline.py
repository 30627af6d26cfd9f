"""How close a decode step comes to this machine's memory limit (``lookahead roofline``).

A decode forward reads every weight once, so no step can beat

    roofline = weight bytes / streaming bandwidth

and the gap between that and a measured step is what kernels, attention,
the KV cache and Python leave on the table. ``measure_roofline`` measures,
for the model at hand:

1. the streaming bandwidth (``streaming_bandwidth``: torch summing a float32
   tensor at least as large as the weights, at least STREAM_MIN_BYTES);
2. the weight bytes a forward reads (``weight_bytes``) and so the roofline;
3. the median cost of one decode-shaped step per row count through every
   route a forward can take (``step_seconds``, on cost/measure.py's
   ``decode_step_timer``), and the best route per row count;
4. a breakdown of one step through the best route (``step_breakdown``):
   linears, attention, KV cache, other ops, Python and dispatch;
5. on the CPU, the best route's step replayed from a TorchScript trace
   (``traced_steps``: model/traced.py, ``traced_forward``; where the best is
   oneDNN's, which is never traced, the fastest route a trace replays), timed
   in the same passes as its eager steps, with its own breakdown;
6. the compute roof (compute_roof.py): what the fastest route's products of the model's linear
   layers do a second, where the arithmetic bounds them, and so the second limit of a step over many
   rows, ``roof(q) = max(roofline, 2 q M / F)``, and the ridge between the two;
7. the host's share of real greedy decode steps, by phase (``host_phases``).

``report_markdown`` and ``plot_roofline`` render the result; cli/roofline.py
writes roofline.json, roofline.md and roofline.png. Every time is in seconds
here (the report shows milliseconds); nothing here asserts a time.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lookahead.model.hugepages import huge_bytes, move_to_huge_pages, on_huge_pages
from lookahead.model.quantized import QuantizedLinear, embedding_facts, quantized_modules
from lookahead.model.switches import ForwardSwitches

from .compute_roof import PEAK_ROWS, compute_throughput, linear_macs, ridge_rows, roof_seconds, sync

STREAM_MIN_BYTES = 256 * 2 ** 20  # the bandwidth probe sums at least this much (past every cache level)
STREAM_WARMUPS = 2  # untimed sums before the timed ones (first touch, frequency ramp-up)
STREAM_REPEATS = 7  # timed sums; the median counts
PROFILED_STEPS = 3  # profiled steps per row count in a breakdown
HOST_TOKENS = 48  # new tokens per prompt of the host-time measurement
LINEAR_OPS = frozenset({"aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "aten::bmm", "aten::baddbmm",
                        "aten::addbmm", "aten::mv", "aten::addmv", "aten::dot",
                        "mkldnn::_linear_pointwise",  # matrix products, by name (this one: the onednn route) ...
                        "lookahead_native::linear",  # ... and lookahead's C++ op (a traced step's kernel route)
                        "lookahead_native::tiled",  # ... and its tiled kernel (an eager step's, in float32)
                        "lookahead_native::qlinear", "lookahead_native::qlinear_int8",
                        "lookahead_native::qlinear_int8_x16"})  # ... and GGUF blocks
KV_RANGE = "lookahead::kv_cache_update"  # the profiler range put around the KV cache's update (``attributed``)
ATTENTION_OPS = frozenset({"lookahead_native::attend"})  # lookahead's attention op (native/fused.cpp)
PARTS = ("linears", "attention", "kv cache", "other ops", "python and dispatch")  # a step's breakdown, in order
LOG_SPAN = 20  # the plot's ms axis turns logarithmic past this ratio of its largest to its smallest value
PROMPTS = ("Write a Python function that returns the n-th Fibonacci number, with a docstring and two tests.",
           "List the planets of the solar system in order, one per line, each with one short fact.")


# ---------------------------------------------------------------- the limit
def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights one decode forward reads: every distinct parameter tensor once.

    A tensor shared by several parameters (a tied embedding / lm_head) counts
    once; an input embedding table that is not also the output projection is
    left out (a forward reads only the looked-up rows of it).
    """
    embedding = model.get_input_embeddings()
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    output_weight = getattr(output, "weight", None)
    table = getattr(embedding, "weight", None)
    skipped = None if embedding is None or table is None or table is output_weight else table
    seen: set[tuple] = set()
    total = 0
    linears = [m.stored for m in quantized_modules(model) if isinstance(m, QuantizedLinear)]
    for module in quantized_modules(model):  # a GGUF's blocks (model/quantized.py): their bytes as held (the
        stored = module.stored  # blocks, or their 16-row layout for int8 products)
        if isinstance(module, QuantizedLinear) or any(stored is held for held in linears):
            key = ("blocks", stored.data_ptr())
            if key not in seen:
                seen.add(key)
                total += stored.numel() * stored.element_size()
    for param in model.parameters():
        if skipped is not None and param is skipped:
            continue
        key = (param.device.type, param.data_ptr(), param.dtype, tuple(param.shape)) if param.device.type != "meta" \
            else (id(param),)  # (meta tensors have no storage to share)
        if key not in seen:
            seen.add(key)
            total += param.numel() * param.element_size()
    return total


def streaming_bandwidth(nbytes: int, device: torch.device | str = "cpu", warmups: int = STREAM_WARMUPS,
                        repeats: int = STREAM_REPEATS, huge: bool = False) -> tuple[float, list[float]]:
    """(bytes per second, the timed seconds [repeats]) of torch summing a float32 tensor of ``nbytes``
    bytes (rounded down to whole floats, at least one) on ``device``, on torch's threads as set; ``huge``:
    on the CPU, the tensor on transparent huge pages where the kernel offers them (as the weights are,
    model/hugepages.py), so the roofline streams as the steps do.

    ``warmups`` untimed sums first; the rate is the tensor's bytes over the median timed sum.
    """
    device = torch.device(device)
    count = max(1, nbytes // 4)
    arena = huge_bytes(count * 4) if huge and device.type == "cpu" else None
    if arena is not None:
        data = arena.view(torch.float32).fill_(1.0)  # [count], every page touched
    else:
        data = torch.ones(count, dtype=torch.float32, device=device)  # [count], every page touched
    times = []
    for index in range(warmups + repeats):
        sync(device)
        began = time.perf_counter()
        data.sum().item()  # .item(): the result back on the host, so the sum is done
        took = time.perf_counter() - began
        if index >= warmups:
            times.append(took)
    del data
    return count * 4 / statistics.median(times), times


def roofline_seconds(nbytes: int, bandwidth: float) -> float:
    """Seconds to stream ``nbytes`` at ``bandwidth`` bytes per second: no forward reading them is faster."""
    return nbytes / bandwidth


# ---------------------------------------------------------------- step cost per row count
def route_label(route) -> str:
    """A route's label ('kernel x2'); 'as set' for None (torch as it is set: a model off the CPU)."""
    return route.label if route is not None else "as set"


def runs_as(route, rows: int, threads: int):
    """The route a forward over ``rows`` rows through ``route`` really runs as (model/fewrows.py,
    model/routing.py): past FEW_ROWS_MAX rows every route is torch as set ("torch x{threads}"); the
    kernel outside 1..KERNEL_ROWS_MAX (where the tiled kernel runs: any rows) and W @ x^T ("mm") outside
    1..MM_ROWS_MAX rows are torch's linear on the route's threads. None stays None."""
    from lookahead.model.fewrows import FEW_ROWS_MAX, KERNEL_ROWS_MAX, MM_ROWS_MAX
    from lookahead.model.routing import Route
    from lookahead.native.build import tiled_width

    if route is None:
        return None
    if rows > FEW_ROWS_MAX:
        return Route(threads, "torch")
    kernel_max = FEW_ROWS_MAX if tiled_width() else KERNEL_ROWS_MAX
    if (route.linear == "kernel" and not 1 <= rows <= kernel_max) or \
            (route.linear == "mm" and not 1 <= rows <= MM_ROWS_MAX):
        return Route(route.threads, "torch")
    return route


def own_routes(routes: list, rows: int, threads: int) -> list:
    """The routes that run a forward over ``rows`` rows their own way (a route that runs as another
    of the list, e.g. "mm x2" over one row as "torch x2", is left out), in the list's order."""
    kept, seen = [], set()
    for route in routes:
        actual = runs_as(route, rows, threads)
        if actual not in seen and (actual == route or actual not in routes):
            seen.add(actual)
            kept.append(route)
    return kept


def peak_routes(routes: list, rows: int, threads: int) -> dict:
    """Label -> route of the routes worth timing for the compute roof over ``rows`` rows: those that run
    their own way there (``own_routes``) on all ``threads`` of torch (None, torch as set, included)."""
    return {route_label(r): r for r in own_routes(routes, rows, threads) if r is None or r.threads == threads}


def step_seconds(time_one: Callable, rows: tuple[int, ...], routes: list, repeats: int,
                 threads: int) -> dict[str, list[float | None]]:
    """Route label -> median seconds [S] of one step over rows[s] rows through that route (None where
    the route runs as another one at that row count: ``own_routes``).

    ``time_one(q, route)`` times one step (cost/measure.py ``decode_step_timer``). One untimed
    forward of every (row count, route) first; then ``repeats`` passes, row counts ascending
    and descending in turn and the routes' order rotated each pass, so a burst of load
    elsewhere lands on one pass rather than on one row count or route. After each pass a
    route whose median so far is over HOPELESS times the fastest's at a row count is timed no
    further there (a 2-thread step beside a busy core can take seconds): its median is of the
    passes it ran.
    """
    from lookahead.cost.measure import HOPELESS

    alive = {q: own_routes(routes, q, threads) for q in rows}
    samples: dict[tuple[int, str], list[float]] = {(q, route_label(r)): [] for q in rows for r in alive[q]}
    for q in rows:  # warm-up: first-call allocations, numba's compiled variants
        for route in alive[q]:
            time_one(q, route)
    for index in range(repeats):
        for q in (rows if index % 2 == 0 else rows[::-1]):
            turn = index % len(alive[q])
            for route in alive[q][turn:] + alive[q][:turn]:
                samples[(q, route_label(route))].append(time_one(q, route))
            medians = {route_label(r): statistics.median(samples[(q, route_label(r))]) for r in alive[q]}
            fastest = min(medians.values())
            alive[q] = [r for r in alive[q] if medians[route_label(r)] <= HOPELESS * fastest]
    return {route_label(r): [statistics.median(samples[(q, route_label(r))]) if (q, route_label(r)) in samples
                             else None for q in rows] for r in routes}


def best_routes(seconds: dict[str, list[float | None]]) -> list[tuple[str, float]]:
    """[(label, seconds)] per row count: the route with the least median there (``step_seconds``' output)."""
    count = len(next(iter(seconds.values())))
    best = []
    for s in range(count):
        label = min((lab for lab in seconds if seconds[lab][s] is not None), key=lambda lab: seconds[lab][s])
        best.append((label, seconds[label][s]))
    return best


# ---------------------------------------------------------------- breakdown of one step
@dataclass
class Elapsed:
    """Seconds spent in a wrapped function while ``attributed`` was entered."""

    seconds: float = 0.0


@contextmanager
def attributed():
    """While entered: lookahead's few-row kernel (``model.fewrows.rows_linear``, which torch's profiler
    does not see) is timed into the yielded ``Elapsed``, and every KV cache update
    (``model.cache.SlotLayer.update``: the layers of ``Target.new_cache()``, the only cache
    marked) runs inside a profiler range named KV_RANGE. Both are patched for the duration only
    and put back in a ``finally``."""
    from lookahead.model import cache, fewrows

    elapsed = Elapsed()
    kernel, update = fewrows.rows_linear, cache.SlotLayer.update

    def timed_kernel(*args, **kwargs):
        began = time.perf_counter()
        try:
            return kernel(*args, **kwargs)
        finally:
            elapsed.seconds += time.perf_counter() - began

    def marked_update(self, *args, **kwargs):
        with torch.profiler.record_function(KV_RANGE):
            return update(self, *args, **kwargs)

    fewrows.rows_linear, cache.SlotLayer.update = timed_kernel, marked_update
    try:
        yield elapsed
    finally:
        fewrows.rows_linear, cache.SlotLayer.update = kernel, update


@contextmanager
def quiet_stderr():
    """File descriptor 2 goes to the null device inside (put back in a ``finally``): torch's profiler
    writes a line from C++ at every start and stop ("USDT: ... profiler_start"), which no Python
    setting turns off. Only the profiler's start and stop run inside; errors still raise."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def op_part(name: str, ancestors: tuple[str, ...]) -> str | None:
    """The part of a step an op's self time counts to; None for what is not an aten op (a profiler
    range's own time is Python: it stays in "python and dispatch").

    ``ancestors``: the names of the op's enclosing events, innermost first. The outermost
    telling one decides: under KV_RANGE "kv cache" (every op of the cache's update: its
    slot copies, slices and views); under or being a matrix product (LINEAR_OPS, by name: the
    rotary embedding's small matmul counts too) "linears"; under or being an op named
    *scaled_dot_product* or being lookahead's attention op (ATTENTION_OPS) "attention"; else "other ops".
    """
    if not name.startswith("aten::"):  # (oneDNN's packed linear and our C++ ops are no aten ops)
        return "linears" if name in LINEAR_OPS else "attention" if name in ATTENTION_OPS else None
    for outer in (*reversed(ancestors), name):
        if outer == KV_RANGE:
            return "kv cache"
        if outer in LINEAR_OPS:
            return "linears"
        if "scaled_dot_product" in outer or outer in ATTENTION_OPS:
            return "attention"
    return "other ops"


def profiled_parts(events) -> dict[str, float]:
    """Seconds of self CPU time per part (PARTS but the last) summed over torch profiler ``events``."""
    parts = dict.fromkeys(PARTS[:-1], 0.0)
    for event in events:
        ancestors, parent = [], event.cpu_parent
        while parent is not None:
            ancestors.append(parent.name)
            parent = parent.cpu_parent
        part = op_part(event.name, tuple(ancestors))
        if part is not None:
            parts[part] += event.self_cpu_time_total * 1e-6  # (microseconds)
    return parts


def scaled_parts(parts: dict[str, float], total: float) -> dict[str, float]:
    """``parts`` scaled by one factor so that they add up to ``total`` (all zero: all of it Python)."""
    whole = sum(parts.values())
    if whole <= 0:
        return {name: (total if name == PARTS[-1] else 0.0) for name in parts}
    return {name: value * total / whole for name, value in parts.items()}


def step_breakdown(time_one: Callable, rows: int, route, step_s: float,
                   steps: int = PROFILED_STEPS) -> tuple[dict[str, float], float]:
    """(seconds per step of each part (PARTS) of a step over ``rows`` rows through ``route``, adding up
    to ``step_s`` (its unprofiled median); the profiled steps' mean wall time).

    ``steps`` steps run under ``torch.profiler`` (CPU) inside ``attributed``. Per step:
    "linears" is the self time of the matrix-product ops plus the time in lookahead's kernel
    (``attributed``; the kernel route's linears never reach torch's dispatcher), "attention" the
    self time of *scaled_dot_product* ops and what runs under them, "kv cache" that of every op
    under the cache's update, "other ops" every other aten op's self time (norms, activations,
    rotary, the mask, the argmax and read-back), and "python and dispatch" the step's wall time
    less all of those (clipped at 0): Python, dispatch and the profiler's own overhead (each of a
    forward's thousands of ops is recorded). The op classes go
    by name (``op_part``), an approximation. Profiling slows the step, so the parts are then
    scaled by one common factor to add up to ``step_s``; as the profiler's overhead sits mostly
    in the residual, "python and dispatch" errs high by about that overhead.
    """
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    with attributed() as kernel:
        with quiet_stderr():
            prof.start()
        try:
            wall = sum(time_one(rows, route) for _ in range(steps))
        finally:
            with quiet_stderr():
                prof.stop()
    parts = profiled_parts(prof.events())
    parts["linears"] += kernel.seconds
    per_step = {name: value / steps for name, value in parts.items()}
    per_step[PARTS[-1]] = max(0.0, wall / steps - sum(per_step.values()))
    return scaled_parts(per_step, step_s), wall / steps


# ---------------------------------------------------------------- the traced forward
def traced_routes(seconds: dict[str, list[float | None]], by_label: dict) -> list:
    """Per row count, the route whose step is timed replayed from a trace: the fastest there (``step_seconds``'
    medians) of the routes a trace replays, i.e. every route but oneDNN's (traced.py: ONEDNN_UNTRACED),
    so that the best route where it is one of them; None where no such route was timed."""
    from lookahead.model.traced import trace_linear

    count = len(next(iter(seconds.values())))
    chosen = []
    for s in range(count):
        timed = {lab: v for lab in seconds
                 if (v := seconds[lab][s]) is not None and trace_linear(by_label[lab].linear) == "any"}
        chosen.append(by_label[min(timed, key=timed.__getitem__)] if timed else None)
    return chosen


def traced_steps(time_eager: Callable, traced_timer: Callable[[], Any], rows: tuple[int, ...], routes: list,
                 repeats: int) -> tuple[list[dict], list[Any]]:
    """Per row count rows[s]: its step through routes[s] replayed from a trace beside the same step run
    eagerly, as {"seconds": traced median or None, "eager_s": eager median, "why": None or why no trace
    served, "route": the route's label}; and the traced timer of each row count.

    Each row count steps on a traced ``StepTimer`` of its own (``traced_timer()``, cost/measure.py), so
    its trace is made at that very step, its row count and route. (One timer's single trace, made at
    the first row count, would be checked at a step of the other row class under that step's route,
    and where that route's products depend on their input's layout, as the mm route's ``torch.mm``
    does, the check refuses it to the bit, and with it every step of that class: which route timed
    fastest at which row count, and so whether any trace served, would follow the machine's load.)
    Its first steps make and check the trace (untimed here, as a warm-up); a step it could not trace
    runs eagerly, which its target's ``last_route`` tells. Then ``repeats`` passes time the eager and
    the traced step of every row count in turn (which of the two goes first alternating), so both see
    the same load.
    """
    eager: dict[int, list[float]] = {q: [] for q in rows}
    traced: dict[int, list[float]] = {q: [] for q in rows}
    why: dict[int, str | None] = {}
    timers = [traced_timer() for _ in rows]
    for q, route, time_traced in zip(rows, routes, timers):
        time_traced(q, route)  # warm-up: makes and checks the trace of this step
        time_traced(q, route)
        ran = time_traced.target.last_route
        failures = time_traced.target.traced.failures if time_traced.target.traced is not None else {}
        why[q] = None if ran.endswith("traced") else \
            "; ".join(sorted(set(failures.values()))) or "no trace served this step"
    for index in range(repeats):
        for q, route, time_traced in zip(rows, routes, timers):
            pair = [(eager[q], time_eager), (traced[q], time_traced)] if why[q] is None else [(eager[q], time_eager)]
            for samples, time_one in (pair if index % 2 == 0 else pair[::-1]):
                samples.append(time_one(q, route))
    entries = [{"seconds": statistics.median(traced[q]) if traced[q] else None, "eager_s": statistics.median(eager[q]),
                "why": why[q], "route": route.label} for q, route in zip(rows, routes)]
    return entries, timers


# ---------------------------------------------------------------- host time of real steps
def prompt_ids(tokenizer, vocab: int) -> list[list[int]]:
    """The token ids of the PROMPTS: through the chat template where the tokenizer has one; without a
    tokenizer, two fixed id sequences below ``vocab`` (one repeating, one not)."""
    if tokenizer is None:
        return [[(3 + i % 7) % vocab for i in range(24)], [(5 + 11 * i) % vocab for i in range(24)]]
    ids = []
    for prompt in PROMPTS:
        if getattr(tokenizer, "chat_template", None):
            encoded = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                    return_tensors="pt", return_dict=True)["input_ids"]  # [1, T]
        else:
            encoded = tokenizer(prompt, return_tensors="pt")["input_ids"]  # [1, T]
        ids.append(encoded[0].tolist())
    return ids


def host_phases(model, tokenizer, config, prompts: list[list[int]], max_new_tokens: int = HOST_TOKENS) -> dict:
    """Where the time of real greedy lookahead steps goes: one LookaheadGenerator(model, tokenizer,
    config) (which may measure its cost curve first: cost/) decodes each prompt (token ids) to
    ``max_new_tokens`` after a short untimed warm-up call.

    Returns steps, new_tokens, tokens_per_step, phase_s (phase -> mean seconds per step, PHASES of
    call/stats.py: "forward" and "verify" are the device's part), host_s and forward_s (the
    median step's host and device seconds) and step_s (the median step's wall time).
    """
    from lookahead import LookaheadGenerator
    from lookahead.call.stats import DEVICE_PHASES, PHASES

    gen = LookaheadGenerator(model, tokenizer, config)
    device = gen.target.device
    gen.generate(torch.tensor([prompts[0]], device=device), max_new_tokens=4, do_sample=False)  # warm-up
    phases = dict.fromkeys(PHASES, 0.0)
    host, forward, step, new_tokens = [], [], [], 0
    for ids in prompts:
        gen.generate(torch.tensor([ids], device=device), max_new_tokens=max_new_tokens, do_sample=False)
        stats = gen.last_stats
        for phase in PHASES:
            phases[phase] += stats.phase_seconds[phase]
        host += stats.host_seconds
        forward += stats.forward_seconds
        step += stats.step_seconds
        new_tokens += stats.new_tokens
    steps = len(step)
    return {"steps": steps, "new_tokens": new_tokens, "tokens_per_step": new_tokens / steps if steps else 0.0,
            "phase_s": {phase: seconds / steps if steps else 0.0 for phase, seconds in phases.items()},
            "device_phases": list(DEVICE_PHASES),
            "host_s": statistics.median(host) if host else 0.0,
            "forward_s": statistics.median(forward) if forward else 0.0,
            "step_s": statistics.median(step) if step else 0.0}


# ---------------------------------------------------------------- everything
def measure_roofline(model, tokenizer, rows: tuple[int, ...], context: int, repeats: int,
                     allow_untested: bool = False, config=None, stream_min_bytes: int = STREAM_MIN_BYTES,
                     host_tokens: int = HOST_TOKENS, traced: bool = True, peak_rows: int = PEAK_ROWS) -> dict:
    """The roofline of ``model`` on this machine beside its measured steps (see the module docstring).

    ``rows``: row counts (each >= 1), ``context``: cached tokens behind every step (>= 1; context +
    the largest row count must fit in the model's context), ``repeats``: timed passes (>= 1),
    ``config``: the LookaheadConfig of the host-time generator (None: the default), ``traced``: time
    the best routes' steps replayed from traces too (``traced_routes``; on the CPU; each step's
    "traced" entry, else None), ``peak_rows``: rows of the compute roof's products (compute_roof.py). Raises
    ValueError for a bad argument and UnsupportedModelError (a ValueError) for a model the engine
    cannot drive. The result holds every number, in seconds and bytes.
    """
    from lookahead import LookaheadConfig
    from lookahead.cost.measure import decode_step_timer, measured_routes
    from lookahead.model.support import check_model, context_length
    from lookahead.model.target import input_device

    rows = tuple(sorted(set(int(q) for q in rows)))
    if not rows or rows[0] < 1 or context < 1 or repeats < 1 or peak_rows < 1:
        raise ValueError(f"rows, context, repeats and peak rows must be >= 1, got rows {list(rows)}, context "
                         f"{context}, repeats {repeats}, peak rows {peak_rows}")
    limit = context_length(model.config)
    if limit is not None and context + rows[-1] > limit:
        raise ValueError(f"a context of {context} tokens plus a step of {rows[-1]} rows passes the model's "
                         f"context of {limit} positions: pass a smaller --context or --rows")
    layout = check_model(model, allow_untested)
    device = input_device(model)
    threads = torch.get_num_threads()
    config = config if config is not None else LookaheadConfig()
    if config.huge_pages and device.type == "cpu":
        move_to_huge_pages(model)  # (where a generator's would be: its steps are the ones timed)
    huge = on_huge_pages(model)
    weights = weight_bytes(model)
    stream_bytes = max(weights, stream_min_bytes)
    bandwidth, stream_times = streaming_bandwidth(stream_bytes, device, huge=huge)
    roofline = roofline_seconds(weights, bandwidth)
    routes = measured_routes(model, True, onednn=True)  # every route there is, oneDNN's included
    time_one = decode_step_timer(model, layout, context)
    seconds = step_seconds(time_one, rows, routes, repeats, threads)
    best = best_routes(seconds)
    by_label = {route_label(r): r for r in routes}
    cpu = device.type == "cpu"  # (off the CPU the profiler's CPU times are the host's launches only; no traces)
    best_route = [by_label[label] for label, _ in best]
    replayed: list = [None] * len(rows)
    timers: list = [None] * len(rows)
    trace_routes = traced_routes(seconds, by_label) if traced and cpu else []
    if traced and cpu and all(r is not None for r in trace_routes):
        replayed, timers = traced_steps(time_one, lambda: decode_step_timer(model, layout, context,
                                                                         switches=ForwardSwitches(traced=True)),
                                        rows, trace_routes, repeats)
    rates = compute_throughput(model, time_one.target.linears, peak_routes(routes, peak_rows, threads), peak_rows)
    macs = linear_macs(model)
    peak_route = max(rates, key=rates.__getitem__)
    peak = rates[peak_route]
    steps = []
    for q, route, (label, best_s), trace, time_traced in zip(rows, best_route, best, replayed, timers):
        parts, profiled = step_breakdown(time_one, q, route, best_s) if cpu else (None, None)
        roof = roof_seconds(roofline, macs, q, peak)
        if trace is not None and trace["seconds"] is not None and time_traced is not None:
            trace["x_roofline"] = trace["seconds"] / roofline
            trace["x_roof"] = trace["seconds"] / roof
            trace["breakdown_s"], trace["profiled_s"] = step_breakdown(time_traced, q, by_label[trace["route"]],
                                                                       trace["seconds"])
            trace["linear_flops_per_s"] = linear_rate(macs, q, trace["breakdown_s"])
        steps.append({"rows": q, "seconds": {lab: seconds[lab][rows.index(q)] for lab in seconds},
                      "best_route": label, "best_s": best_s, "x_roofline": best_s / roofline, "roof_s": roof,
                      "x_roof": best_s / roof, "breakdown_s": parts, "profiled_s": profiled,
                      "linear_flops_per_s": linear_rate(macs, q, parts), "traced": trace})
    host = host_phases(model, tokenizer, config,
                       prompt_ids(tokenizer, embedding_facts(model)[2]), host_tokens)
    return {"device": str(device), "threads": threads, "context": context, "repeats": repeats, "huge_pages": huge,
            "weight_bytes": weights, "stream_bytes": max(1, stream_bytes // 4) * 4,
            "stream_s": stream_times, "bandwidth_bytes_per_s": bandwidth, "roofline_s": roofline,
            "routes": list(seconds), "steps": steps, "host": host,
            "compute": {"rows": peak_rows, "macs_per_row": macs, "flops_per_s": rates, "best_route": peak_route,
                        "peak_flops_per_s": peak, "ridge_rows": ridge_rows(roofline, macs, peak)}}


def linear_rate(macs: int, rows: int, parts: dict[str, float] | None) -> float | None:
    """Float operations per second of a step's linears (2 * rows * macs over the breakdown's "linears"
    seconds); None without a breakdown or where it gave the linears no time."""
    if parts is None or parts["linears"] <= 0:
        return None
    return 2.0 * rows * macs / parts["linears"]


# ---------------------------------------------------------------- the report
def _ms(seconds: float | None) -> str:
    """Seconds as milliseconds for a table cell ('-' for None)."""
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.1f}" if seconds * 1e3 >= 1 else f"{seconds * 1e3:.2f}"


def _part_cells(parts: dict[str, float] | None) -> str:
    """A breakdown's table cells, PARTS in order, joined by " | " ('-' each where there is none)."""
    return " | ".join(_ms(parts[name]) if parts is not None else "-" for name in PARTS)


def _width(result: dict) -> str:
    """The tiled kernel's width as the report says it: '16 lanes, the widest this CPU runs (2.5 ms against 8 lanes'
    2.8)'."""
    lanes, timings = result.get("tiled_lanes", 0), result.get("tiled_timings_ms", [])
    if not lanes:
        return "none (numba's kernel computes the kernel route's products)"
    if len(timings) == 2:
        ms = dict(zip((8, 16), timings))  # (linear.cpp's tiled_width_timings: 8 lanes, then 16)
        other = 8 if lanes == 16 else 16
        return f"{lanes} lanes, the widest this CPU runs ({ms[lanes]:.2f} ms against {other} lanes' {ms[other]:.2f})"
    return f"{lanes} lanes (the only width this CPU runs)"


def _gflops(rate: float | None) -> str:
    """Float operations per second as a GFLOP/s cell ('-' for None)."""
    return "-" if rate is None else f"{rate / 1e9:.0f}"


def _roof_cells(step: dict) -> str:
    """A step's (or a traced step's) "x roof" and "linears GFLOP/s" cells."""
    return f"{step['x_roof']:.2f}x | {_gflops(step.get('linear_flops_per_s'))}"


def compute_lines(result: dict) -> list[str]:
    """The report's lines on the compute roof (compute_roof.py) and the ridge."""
    compute = result["compute"]
    others = ", ".join(f"{label} {_gflops(rate)}" for label, rate in compute["flops_per_s"].items()
                       if label != compute["best_route"])
    return [f"- linear layers: {compute['macs_per_row'] / 1e6:.1f} M multiply-adds a row (every nn.Linear, the output "
            "head included)",
            f"- compute roof: {_gflops(compute['peak_flops_per_s'])} GFLOP/s (the linears over {compute['rows']} rows "
            f"of random input through {compute['best_route']}, the fastest route there"
            f"{'; ' + others if others else ''}): measured, so a lower bound of the cores' peak",
            f"- ridge: {compute['ridge_rows']:.1f} rows (past it the linears' arithmetic, not the weights' bytes, "
            "bounds a step: roof = max(roofline, 2 x rows x multiply-adds / compute roof), the tables' \"x roof\")"]


def report_markdown(result: dict) -> str:
    """The report of ``measure_roofline``'s result (with the keys cli/roofline.py adds: model, dtype,
    cpu, torch, transformers) as markdown: a header, the step table, the host-time table."""
    lines = [f"# Roofline: {result['model']} ({result['dtype']}, {result['device']})", "",
             f"- CPU: {result['cpu']}",
             f"- threads: {result['threads']}",
             f"- tiled kernel: {_width(result)}",
             f"- torch {result['torch']}, transformers {result['transformers']}",
             f"- model: {result['model']}, dtype {result['dtype']}",
             f"- weight bytes a forward reads: {result['weight_bytes'] / 1e6:.1f} MB"
             f"{' (on 2 MB pages: model/hugepages.py)' if result.get('huge_pages') else ''}",
             f"- streaming bandwidth: {result['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s "
             f"(torch summing {result['stream_bytes'] / 1e6:.0f} MB of float32"
             f"{' on 2 MB pages' if result.get('huge_pages') else ''}, median of {len(result['stream_s'])})",
             f"- roofline (weights / bandwidth): {_ms(result['roofline_s'])} ms per step",
             *compute_lines(result),
             f"- steps after {result['context']} cached tokens, median of {result['repeats']}; "
             f"routes: {', '.join(result['routes'])}", "",
             "Step time through the best route and its breakdown, ms per step (profiled self time of the ops by "
             "name, scaled to add up to the unprofiled median; python+dispatch: the wall time the ops leave):", "",
             "| rows | best route | ms | x roofline | linears | attention | kv cache | other ops | "
             "python+dispatch | x roof | linears GFLOP/s |",
             "|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for step in result["steps"]:
        lines.append(f"| {step['rows']} | {step['best_route']} | {_ms(step['best_s'])} | "
                     f"{step['x_roofline']:.2f}x | {_part_cells(step['breakdown_s'])} | {_roof_cells(step)} |")
    lines += traced_lines(result["steps"])
    lines += ["", "Median ms per step through every route ('-': the route runs as another one there):", "",
              "| route | " + " | ".join(str(s["rows"]) for s in result["steps"]) + " |",
              "|:---|" + "---:|" * len(result["steps"])]
    for label in result["routes"]:
        lines.append(f"| {label} | " + " | ".join(_ms(s["seconds"][label]) for s in result["steps"]) + " |")
    host = result["host"]
    lines += ["", f"Host time of real greedy lookahead steps ({host['steps']} steps, {host['new_tokens']} new tokens, "
              f"{host['tokens_per_step']:.2f} tokens/step; device phases: {', '.join(host['device_phases'])}):", "",
              "| phase | ms per step (mean) |", "|:---|---:|"]
    for phase, seconds in host["phase_s"].items():
        lines.append(f"| {phase} | {_ms(seconds)} |")
    lines += ["", f"Median step: {_ms(host['step_s'])} ms = host {_ms(host['host_s'])} ms (median) + "
              f"forward and read-back {_ms(host['forward_s'])} ms (median)."]
    return "\n".join(lines)


def traced_lines(steps: list[dict]) -> list[str]:
    """The report's table of the traced steps (``traced_steps``), or nothing where none was timed."""
    if not any(step.get("traced") for step in steps):
        return []
    lines = ["", "The best route's step replayed from a TorchScript trace (`traced_forward`, on by default; "
             "model/traced.py; oneDNN's route is never traced: then the fastest route a trace replays), timed in "
             "the same passes as its eager step through that route, and its "
             "breakdown (the kv cache's writes count as other ops there):", "",
             "| rows | route | eager ms | traced ms | traced / eager | x roofline | linears | attention | kv cache | "
             "other ops | python+dispatch | x roof | linears GFLOP/s |",
             "|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    whys = []
    for step in steps:
        trace = step.get("traced")
        if not trace:
            continue
        if trace["seconds"] is None:
            whys.append(f"{step['rows']} rows: {trace['why']}")
            lines.append(f"| {step['rows']} | {trace.get('route', step['best_route'])} | {_ms(trace['eager_s'])} | - | "
                         f"- | - | "
                         f"{_part_cells(None)} | - | - |")
            continue
        lines.append(f"| {step['rows']} | {trace.get('route', step['best_route'])} | {_ms(trace['eager_s'])} | "
                     f"{_ms(trace['seconds'])} | "
                     f"{trace['seconds'] / trace['eager_s']:.2f} | {trace['x_roofline']:.2f}x | "
                     f"{_part_cells(trace.get('breakdown_s'))} | {_roof_cells(trace)} |")
    if whys:
        lines += ["", "No trace served: " + "; ".join(whys) + "."]
    return lines


def plot_roofline(result: dict, path: str | Path) -> Path:
    """Step ms against rows (log2), one line per route, the roofline as a dashed horizontal line;
    saved as a PNG at ``path`` (matplotlib's Agg backend). The ms axis is logarithmic when the
    slowest point is over LOG_SPAN times the fastest (or the roofline), else linear from 0."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [s["rows"] for s in result["steps"]]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    shown = [result["roofline_s"] * 1e3]  # every plotted ms
    for label in result["routes"]:
        points = [(q, s["seconds"][label] * 1e3) for q, s in zip(rows, result["steps"]) if s["seconds"][label]]
        if points:
            ax.plot(*zip(*points), marker="o", label=label)
            shown += [ms for _, ms in points]
    traced = [(q, s["traced"]["seconds"] * 1e3) for q, s in zip(rows, result["steps"])
              if s.get("traced") and s["traced"]["seconds"]]
    if traced:
        ax.plot(*zip(*traced), marker="s", color="black", label="best route, traced")
        shown += [ms for _, ms in traced]
    ax.axhline(result["roofline_s"] * 1e3, color="black", linestyle="--",
               label=f"roofline {result['roofline_s'] * 1e3:.1f} ms "
                     f"({result['weight_bytes'] / 1e6:.0f} MB at {result['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s)")
    compute = result.get("compute")
    if compute:  # the roof over the rows: flat to the ridge, then the linears' arithmetic
        ridge = compute["ridge_rows"]
        grid = sorted(set(rows) | ({ridge} if rows[0] < ridge < rows[-1] else set()))
        roof = [roof_seconds(result["roofline_s"], compute["macs_per_row"], q, compute["peak_flops_per_s"]) * 1e3
                for q in grid]
        ax.plot(grid, roof, color="grey", linestyle="-.",
                label=f"roof: past {ridge:.1f} rows the linears' arithmetic at "
                      f"{compute['peak_flops_per_s'] / 1e9:.0f} GFLOP/s")
        shown += roof
    if len(set(rows)) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(rows, [str(q) for q in rows])
    if max(shown) > LOG_SPAN * min(shown):  # a route slowed by a load elsewhere would flatten the rest
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("rows per step")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"{result['model']} ({result['dtype']}) on {result['cpu']}, {result['threads']} "
                 f"thread{'s' if result['threads'] != 1 else ''}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: over no point
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return Path(path)
