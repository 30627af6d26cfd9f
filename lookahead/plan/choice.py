"""The batch-wide half of planning: one window width and tree size for every sequence of a step,
and what the step cost, refining the shared cost curve.

The decode loop holds one ``StepChooser`` per generate call; every sequence's ``Planner`` prices
its own questions (a draft's "is drafting worth it", a source's feedback) through the same one.
"""

from __future__ import annotations

import numpy as np

from ..config import LookaheadConfig
from ..cost import CostModel
from .acceptance import AcceptanceStats
from .budget import forecast_step
from .pause import ProposalPause
from .speculation import SpeculationCheck
from .window import window_rows


def window_widths(config: LookaheadConfig, budgeted: bool) -> np.ndarray:
    """[O] the window widths a step may take, 0 (x alone) first: every width up to W when the
    budget chooses, else the whole window W (a fixed budget); only 0 when the window is x alone.

    W=3, N=3 budgeted -> [0 1 2 3]; not budgeted -> [3]; W=1, N=2 -> [0].
    """
    if config.lookahead_rows <= 1:
        return np.zeros(1, dtype=np.int64)
    if not budgeted:
        return np.array([config.window], dtype=np.int64)
    return np.arange(config.window + 1, dtype=np.int64)


class StepChooser:
    """The step's shape for a batch: (window width, tree nodes) with the most expected tokens per second."""

    def __init__(self, config: LookaheadConfig, cost: CostModel | None, acceptance: AcceptanceStats):
        self.config = config
        self.cost = cost  # the batch's curve (None: a fixed budget)
        self.acceptance = acceptance  # the call's regime table: its calibration maps promises to yields
        self.widths = window_widths(config, cost is not None)  # [O] the window's options, x alone first
        self.window_rows = np.array([window_rows(w, config.ngram) for w in self.widths])  # [O]
        self.check = SpeculationCheck()  # what speculative steps gave against their forecasts
        self.pause = ProposalPause(config.pause_plain_batches)  # whether a batch's step proposes at all
        self.paused = False  # the step about to run proposes nothing (``proposing``)
        self.forecast: tuple[str, int, float, float] | None = None  # the loop's step: (kind, sequences, tokens,
        # seconds) as forecast

    def choose(self, probs: list[np.ndarray], column_gain: float, spent: float = 0.0) -> tuple[int, int]:
        """(window width, tree nodes) for sequences whose ranked path probabilities are ``probs``
        (one array per sequence); ``column_gain``: tokens one window column fed is worth to the sources,
        ``spent``: seconds the sources already spent on forwards of their own this step."""
        width, size, _ = self._forecast(probs, column_gain, spent)
        return width, size

    def corrections(self) -> tuple[float, float]:
        """(extra, cost_correction): what a speculative option's forecast extra tokens and seconds are multiplied by
        (SpeculationCheck; (1, 1) with the check off)."""
        return (self.check.extra(), self.check.cost_correction()) if self.config.check_speculation else (1.0, 1.0)

    def proposing(self, sequences: int) -> bool:
        """Whether the step about to run, of ``sequences`` sequences, proposes (1. propose); one that does not is
        a plain step (``decide``), where a batch's budget has been taking plain steps lately (pause.py)."""
        self.paused = not self.pause.proposing(sequences)
        return not self.paused

    def decide(self, probs: list[np.ndarray], column_gain: float, spent: float = 0.0) -> tuple[int, int]:
        """``choose`` for the step about to run, remembering what it expects of it for ``record_outcome``;
        (0, 0), a plain step, where ``proposing`` said it proposes nothing."""
        self.forecast = None
        if self.paused:
            return 0, 0
        width, size, expected = self._forecast(probs, column_gain, spent)
        self.pause.decided(len(probs), width > 0 or size > 0)
        if expected is not None:
            kind = "window" if width > 0 else ("tree" if size > 0 else "plain")
            self.forecast = (kind, len(probs), expected[0], expected[1])
        return width, size

    def _forecast(self, probs: list[np.ndarray], column_gain: float,
                  spent: float) -> tuple[int, int, tuple[float, float] | None]:
        """(window width, tree nodes, what the step is expected to give before the check's corrections)."""
        gain = self.widths * column_gain  # [O] tokens the window's columns are worth
        # one sequence: its best is never below plain; float: an int share (fair_share=1) would compile the
        # kernel a second time mid-decode
        share = float(self.config.fair_share) if len(probs) > 1 else 0.0
        option, size, expected = forecast_step(probs, self.window_rows, gain, self.cost, self.config.max_tree_nodes,
                                               spent, self.acceptance.calibration(), *self.corrections(), share)
        return int(self.widths[option]), size, expected

    def record_outcome(self, tokens: int, seconds: float | None) -> None:
        """The step ``decide`` shaped gave ``tokens`` in ``seconds``: learn how far off its forecast was (None:
        its time says nothing of the forecast, e.g. it ran a route being tried; nothing is learned)."""
        if self.forecast is not None and seconds is not None:
            kind, sequences, expected_tokens, expected_seconds = self.forecast
            self.check.observe(kind, sequences, (expected_tokens, expected_seconds), (float(tokens), seconds))
        self.forecast = None

    def rows(self, width: int) -> int:
        """Rows the window takes at ``width`` columns (x included)."""
        return int(self.window_rows[int(np.searchsorted(self.widths, width))])

    def unit(self) -> float:
        """Seconds of a plain step (x alone; 0.0 without a cost model)."""
        return float(self.cost.step(1)) if self.cost is not None else 0.0

    def price(self, nodes: int, width: int) -> float:
        """A step feeding ``width`` window columns and ``nodes`` tree nodes, in plain steps (1.0 without
        a cost model)."""
        if self.cost is None:
            return 1.0
        return float(self.cost.step(self.rows(width) + nodes) / self.cost.step(1))

    def observe(self, rows: int, seconds: float) -> None:
        """A step over ``rows`` rows took ``seconds`` of the target's time (refines the shared curve)."""
        if self.cost is not None:
            self.cost.observe(rows, seconds)
