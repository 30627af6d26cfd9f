"""Whose linear kernel prefills a prompt on the CPU: torch's, or lookahead's tiled kernel (fewrows.py).

A prompt's prefill is a forward over hundreds of rows: compute-bound, where a step over a few rows
is bound by reading the weights. Which kernel computes it faster depends on the machine (the tiled
kernel may beat torch's F.linear there; a CPU whose torch build runs a faster GEMM, oneDNN with AMX,
say, may say otherwise; `lookahead roofline --rows 128 --rows 192` times both). So nothing is assumed:
``PrefillChoice`` runs the first prefills of at least MEASURED_ROWS rows through each in turn, and
from then on every prefill through the one that took less time per prompt row (the medians of
TRIES each). Until then, and where the tiled kernel cannot run (not loaded, not float32, another
device, ``few_row_matmul`` off), prefills run as torch is set.

The products of the tiled kernel do not depend on how many rows a forward has, so a prompt row
prefilled through it holds what a step computing that row through it would (each token's argmax
is the verified one either way; fewrows.py says how kernels differ in the last bits).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from .fewrows import FewRowLinear
from .routing import median

MEASURED_ROWS = 32  # prefills of fewer rows are not timed (their fixed costs would dominate)
TRIES = 2  # prefills timed through each kernel before the choice
KINDS = ("torch", "kernel")


class PrefillChoice:
    """The kernel prompts prefill through: measured on the first prefills, then the faster.

    ``linears``: the model's routable linear layers where their tiled kernel can prefill (else None:
    always torch's). Worked example: per-row seconds torch 2e-4, 3e-4 and kernel 1e-4, 1e-4 over the
    first four prefills of 100 rows -> "kernel" from the fifth on.
    """

    def __init__(self, linears: FewRowLinear | None):
        self.linears = linears
        self.per_row: dict[str, list[float]] = {kind: [] for kind in KINDS}  # seconds per prompt row, timed
        self.chosen: str | None = None if linears is not None else "torch"

    def next_kind(self, rows: int) -> str:
        """The kernel a prefill of ``rows`` rows runs through: the chosen one; before the choice, the one
        timed fewer times (torch first), or torch for a prefill too short to time."""
        if self.chosen is not None:
            return self.chosen
        if rows < MEASURED_ROWS:
            return "torch"
        return min(KINDS, key=lambda kind: len(self.per_row[kind]))

    @contextmanager
    def running(self, rows: int) -> Iterator[None]:
        """The body (one prefill forward over ``rows`` rows) runs through ``next_kind``'s kernel, timed
        where the choice is still open."""
        kind = self.next_kind(rows)
        timed = self.chosen is None and rows >= MEASURED_ROWS
        began = time.perf_counter()
        with self.linears.routed(kernel=True) if kind == "kernel" and self.linears is not None else nullcontext():
            yield
        if timed:
            self.per_row[kind].append((time.perf_counter() - began) / rows)
            if all(len(seconds) >= TRIES for seconds in self.per_row.values()):
                self.chosen = min(KINDS, key=lambda k: median(self.per_row[k]))
