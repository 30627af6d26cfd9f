"""Which cost curve a decode is priced by: measured (or read from disk) where it is needed, flat when
the config asks for it, one per batch size, and the draft model's own.

``CostPolicy`` is what the generator asks; it owns no decoding state. A curve is needed where the
adaptive budget sizes steps (``budgeted``) or the model runs on the CPU, where the curve's
measurement also chooses how each forward runs (its ``routing``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..config import LookaheadConfig
from ..model.support import AttentionLayout, context_length
from ..model.switches import ForwardSwitches
from ..model.target import Target
from .curve import CostModel, flat_curve, stand_in_curve
from .store import MeasurementStopped, cached_cost_model, load_cost_model

DRAFT_COST_ROWS = 16  # the draft's curve is measured up to this many rows (it is fed a step's accepted tokens)


def budgeted(config: LookaheadConfig) -> bool:
    """Whether the adaptive budget sizes this config's steps (so a curve prices them)."""
    return config.budget == "adaptive" and config.candidates > 0 and config.max_tree_nodes > 0


def largest_step(config: LookaheadConfig) -> int:
    """Rows of the largest step ``config`` can build: the window's rows and a full tree.

    window 1, ngram 2 (one row), max_tree_nodes 32, candidates 8 -> 33.
    """
    return config.lookahead_rows + (config.max_tree_nodes if config.candidates > 0 else 0)


def fitted_context(context: int, limit: int | None) -> int:
    """The synthetic context a curve is measured at, inside the model's own ``limit`` (None: no limit).

    (256, 128) -> 127; (256, None) -> 256.
    """
    return context if limit is None else max(1, min(context, limit - 1))


def measuring(config: LookaheadConfig, fresh: bool = False) -> dict[str, Any]:
    """``load_cost_model``'s keywords for how a curve is measured and kept: its time bound
    (``calibration_seconds``), whether a curve measured under load is cached (``keep_busy_curve``) and
    ``fresh`` (measured whatever the cache holds)."""
    return {"bound_s": float(config.calibration_seconds), "keep_busy": config.keep_busy_curve, "fresh": fresh}


class CostPolicy:
    """The curves one generator prices steps by (for the target, every batch size, and a draft).

    A batch size whose curve the disk does not hold is measured on first use where the caller can wait
    (``generate`` over several prompts); an open batch (a server's) cannot: its streams would stall for the
    measurement's seconds. There the size is priced by a stand-in (``stand_in_curve``: the largest smaller
    size's curve read at as many rows in all), its forwards run through that size's routes, and it waits in
    ``pending`` until the caller is idle and calls ``measure_pending``.
    """

    def __init__(self, target: Target, config: LookaheadConfig):
        self.target = target
        self.config = config
        self.batches: dict[int, CostModel | None] = {}  # batch size > 1 -> the budget's curve for that batch
        self.stand_ins: dict[int, CostModel | None] = {}  # batch size -> its stand-in until it is measured
        self.pending: set[int] = set()  # batch sizes priced by a stand-in, to measure when the caller is idle

    def priced(self, curve: CostModel | None) -> CostModel | None:
        """The curve the budget prices steps by: None without the adaptive budget, flat with
        budget_curve="flat", else ``curve``."""
        if curve is None or not budgeted(self.config):
            return None
        return flat_curve(curve) if self.config.budget_curve == "flat" else curve

    def needed(self, config: LookaheadConfig) -> bool:
        """Whether ``config``'s decode needs a curve: the adaptive budget prices its steps, or its forwards run
        on the CPU, where the curve's measurement chooses their routes."""
        return budgeted(config) or self.target.device.type == "cpu"

    def measure(self, config: LookaheadConfig, batch: int = 1, fresh: bool = False,
                cached_only: bool = False, stop: Callable[[], bool] | None = None) -> CostModel | None:
        """The forward-cost curve up to the largest step ``config`` can build (cached on disk; ``fresh``:
        measured whatever the cache holds, ``lookahead costs measure``; ``cached_only``: None where the disk
        holds none, nothing measured), with the routes forwards run through on the CPU; None where nothing
        needs it (``needed``). ``stop``: asked before every timed forward (store.py's MeasurementStopped)."""
        if not self.needed(config):
            return None
        context = fitted_context(config.calibration_context, self.target.context)
        # (the forwards as the decode's run: the config's switches, traced where the target traces)
        switches = dataclasses.replace(ForwardSwitches.of(config), traced=self.target.traced is not None)
        if cached_only:
            return cached_cost_model(self.target.model, self.target.layout, largest_step(config), context,
                                     config.calibration_repeats, config.cost_cache_dir, batch, switches=switches)
        return load_cost_model(self.target.model, self.target.layout, largest_step(config), context,
                               config.calibration_repeats, config.cost_cache_dir, batch, switches=switches,
                               stop=stop, **measuring(config, fresh))

    def for_batch(self, batch: int, run_config: LookaheadConfig, single: CostModel | None,
                  wait: bool = True) -> CostModel | None:
        """The budget's curve of a step over ``batch`` sequences decoded under ``run_config``: ``single``
        for one, else read from disk or measured on first use, its routes set on the target. With ``wait``
        False a size the disk does not hold is not measured: it is priced by its stand-in and left
        ``pending`` (see the class)."""
        if batch == 1:
            return single
        if batch not in self.batches:
            curve = self.measure(run_config, batch, cached_only=not wait)
            if curve is None and not wait and self.needed(run_config):
                self.pending.add(batch)
                return self.stand_in(batch, single)
            self._keep(batch, curve)
        return self.batches[batch]

    def stand_in(self, batch: int, single: CostModel | None) -> CostModel | None:
        """The curve ``batch`` sequences are priced by until theirs is measured: the largest smaller batch
        size's curve (``single``'s for one) read at as many rows in all (``stand_in_curve``), made once and
        refined by the steps that run on it."""
        if batch not in self.stand_ins:
            smaller = [(size, curve) for size, curve in self.batches.items() if size < batch and curve is not None]
            size, base = max(smaller, key=lambda pair: pair[0], default=(1, single))
            self.stand_ins[batch] = stand_in_curve(base, batch / size) if base is not None else None
        return self.stand_ins[batch]

    def measure_pending(self, run_config: LookaheadConfig, stop: Callable[[], bool] | None = None) -> int | None:
        """Measure the curve of the smallest ``pending`` batch size (as ``for_batch`` would have on first
        use), which replaces its stand-in; the size measured, or None where none is pending or ``stop`` (asked
        before every timed forward) said True first: then the size stays pending, nothing kept. A measurement
        that fails otherwise leaves the size's stand-in for good (not pending: it is not tried again) and
        raises."""
        if not self.pending:
            return None
        batch = min(self.pending)
        try:
            curve = self.measure(run_config, batch, stop=stop)
        except MeasurementStopped:
            return None
        except Exception:
            self.pending.discard(batch)
            self.batches[batch] = self.stand_ins.pop(batch, None)  # (kept as the size's curve: not tried again)
            raise
        self.pending.discard(batch)
        self._keep(batch, curve)
        self.stand_ins.pop(batch, None)
        return batch

    def _keep(self, batch: int, curve: CostModel | None) -> None:
        """``batch``'s curve from now on, its routes set on the target."""
        if curve is not None and curve.routing is not None:
            self.target.routings[batch] = curve.routing
        self.batches[batch] = self.priced(curve)

    def draft(self, draft_model: Any, layout: AttentionLayout) -> CostModel:
        """The draft's forward-cost curve over as many rows as it is fed at once (cached on disk)."""
        config = self.config
        rows = min(DRAFT_COST_ROWS, config.max_tree_nodes + 2)
        context = fitted_context(config.calibration_context, context_length(draft_model.config))
        # (eager, with the draft's routes, drafter.py: no graphs, no trace)
        switches = dataclasses.replace(ForwardSwitches.of(config), graphs=False, traced=False)
        return load_cost_model(draft_model, layout, rows, context, config.calibration_repeats, config.cost_cache_dir,
                               switches=switches, **measuring(config))
