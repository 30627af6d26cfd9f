"""What a row of vLLM's step costs, learned from the time between the proposer's calls.

vLLM calls the proposer once a step, so the time from one call to the next is one engine step:
the forward over every running request's token and the draft tokens proposed at the earlier call,
sampling, verification, vLLM's own bookkeeping, and the proposer itself. ``StepClock`` fits
seconds = a + b * rows over recent steps (weighted least squares, older steps decaying) and keeps
the engine's recent output rate R (tokens per second). A draft token with acceptance chance p then
pays when p >= b * R: the tokens it is expected to add against those its row's time would have
produced at the current rate (``threshold``). A step that admitted or lost a request (a prefill rode
along, or the batch changed) says little about rows and is left out (``tick``'s ``clean``).

A slope is believed as far as the steps determine it. Where step times scatter far more than a
row moves them (a shared or busy machine), a slope fitted to them can land anywhere, and a high one
stops drafting altogether (on one CI machine "auto" drafted 9 tokens over two rounds of four
requests where a fixed 0.3 drafted 197 on this one; its step times were not recorded). With b's
standard error s, the threshold is w * b * R with w = b^2 / (b^2 + s^2): steps whose time follows
their rows give the fitted threshold, steps whose rows explain little of their time pull it toward
the floor, as rows that cost nothing measurable would.

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
        self.w = self.x = self.y = self.xx = self.xy = self.yy = 0.0  # decayed sums of weight, rows, seconds,
        # rows^2, rows*s, s^2
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
        for name in ("w", "x", "y", "xx", "xy", "yy", "tokens", "seconds"):
            setattr(self, name, getattr(self, name) * DECAY)
        self.w += 1.0
        self.x += rows
        self.y += seconds
        self.xx += rows * rows
        self.xy += rows * seconds
        self.yy += seconds * seconds
        self.tokens += tokens
        self.seconds += seconds
        self.count += 1

    def slope(self) -> float | None:
        """b, seconds a row (>= 0), once WARM clean steps varied in rows; None before."""
        fit = self._fit()
        return None if fit is None else max(fit[0], 0.0)

    def _fit(self) -> tuple[float, float] | None:
        """(b as fitted, its standard error) once WARM clean steps varied in rows; None before."""
        if self.count < WARM:
            return None
        spread = self.xx - self.x * self.x / self.w  # rows' weighted sum of squares about their mean
        if spread <= 1e-9 * max(self.xx, 1.0):
            return None  # every step had the same rows: nothing to tell a row's cost by
        covariance = self.xy - self.x * self.y / self.w
        slope = covariance / spread
        residual = max(self.yy - self.y * self.y / self.w - slope * covariance, 0.0)  # seconds the line leaves
        error = math.sqrt(residual / max(self.w - 2.0, 1.0) / spread)
        return slope, error

    def trust(self) -> float:
        """How well the steps determine b: b^2 / (b^2 + its standard error^2), 0 to 1 (0 before the fit
        and where the fitted b is not above 0)."""
        return _trust(self._fit())

    def rate(self) -> float | None:
        """Recent output tokens per second (None before any clean step)."""
        return self.tokens / self.seconds if self.seconds > 0 else None

    def threshold(self, fallback: float) -> float:
        """The least acceptance chance a draft token needs to pay now: w * b * R, kept within FLOOR and
        CEILING (``fallback`` before the fit)."""
        fit, rate = self._fit(), self.rate()  # one fit a step
        if fit is None or rate is None or not math.isfinite(fit[0] * rate):
            return fallback
        return min(max(_trust(fit) * max(fit[0], 0.0) * rate, FLOOR), CEILING)


def _trust(fit: tuple[float, float] | None) -> float:
    """b^2 / (b^2 + se^2) of a fit (b, se); 0 without one or where b is not above 0."""
    if fit is None or fit[0] <= 0.0:
        return 0.0
    slope, error = fit
    return slope * slope / (slope * slope + error * error)
