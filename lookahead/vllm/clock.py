"""What a row of vLLM's step costs, learned from the time between the proposer's calls.

vLLM calls the proposer once a step, so the time from one call to the next is one engine step:
the forward over every running request's token and the draft tokens proposed at the earlier call,
sampling, verification, vLLM's own bookkeeping, and the proposer itself. ``StepClock`` fits
seconds = a + b * rows over recent steps (weighted least squares, older steps decaying) and keeps
the engine's recent output rate R (tokens per second). A draft token with acceptance chance p then
pays when p >= b * R: the tokens it is expected to add against those its row's time would have
produced at the current rate (``threshold``). A step that admitted or lost a request (a prefill rode
along, or the batch changed) says little about rows and is left out (``tick``'s ``clean``).

Worked example: steps of 4 rows took 50 ms and steps of 12 rows 66 ms: b = 2 ms a row; at 60
tokens/s a draft token must be accepted with chance 0.12 to pay. On a GPU, where rows are nearly
free, the threshold falls toward its floor; on a CPU with many requests in flight it rises.
"""

from __future__ import annotations

import math

DECAY = 0.97  # weight of the past per clean step: about the last 30 steps count
WARM = 12  # clean steps before the fit is used
FLOOR, CEILING = 0.05, 0.9  # the learned threshold stays in here
OUTLIER = 4.0  # an interval this many times the running mean (a pause between client calls) is left out


class StepClock:
    """seconds = a + b * rows over recent clean steps, and the recent output rate; see the module docstring."""

    def __init__(self) -> None:
        self.last: float | None = None  # when the proposer was last called
        self.rows = 0  # rows the step after that call verifies (requests + draft tokens)
        self.w = self.x = self.y = self.xx = self.xy = 0.0  # decayed sums of weight, rows, seconds, rows^2, rows*s
        self.tokens = self.seconds = 0.0  # decayed output tokens and seconds
        self.count = 0  # clean steps seen

    def tick(self, now: float, tokens: int, clean: bool) -> None:
        """The proposer is called at ``now``; ``tokens`` were output since the last call; ``clean``: the
        batch neither gained nor lost a request since then."""
        if self.last is not None and clean and self.rows > 0:
            seconds = now - self.last
            mean = self.y / self.w if self.w > 0 else seconds
            if seconds > 0 and (self.count < WARM or seconds < OUTLIER * mean):
                self._add(float(self.rows), seconds, tokens)
        self.last = now

    def proposed(self, rows: int) -> None:
        """The step after this call verifies ``rows`` rows (requests and draft tokens together)."""
        self.rows = rows

    def _add(self, rows: float, seconds: float, tokens: int) -> None:
        for name in ("w", "x", "y", "xx", "xy", "tokens", "seconds"):
            setattr(self, name, getattr(self, name) * DECAY)
        self.w += 1.0
        self.x += rows
        self.y += seconds
        self.xx += rows * rows
        self.xy += rows * seconds
        self.tokens += tokens
        self.seconds += seconds
        self.count += 1

    def slope(self) -> float | None:
        """b, seconds a row (>= 0), once WARM clean steps varied in rows; None before."""
        if self.count < WARM:
            return None
        spread = self.xx - self.x * self.x / self.w
        if spread <= 1e-9 * max(self.xx, 1.0):
            return None  # every step had the same rows: nothing to tell a row's cost by
        return max((self.xy - self.x * self.y / self.w) / spread, 0.0)

    def rate(self) -> float | None:
        """Recent output tokens per second (None before any clean step)."""
        return self.tokens / self.seconds if self.seconds > 0 else None

    def threshold(self, fallback: float) -> float:
        """The least acceptance chance a draft token needs to pay now (``fallback`` before the fit)."""
        slope, rate = self.slope(), self.rate()
        if slope is None or rate is None or not math.isfinite(slope * rate):
            return fallback
        return min(max(slope * rate, FLOOR), CEILING)
