"""Context matcher: propose what followed earlier occurrences of the current suffix."""

from __future__ import annotations

import numpy as np

from ..kernels.match import match_continuations


class ContextMatcher:
    """Prompt lookup generalised: the longest suffix (match_max .. match_min tokens)
    of prompt + output that occurred before proposes its continuation."""

    name = "context"

    def __init__(self, match_min: int, match_max: int, length: int):
        self.match_min = match_min
        self.match_max = match_max
        self.length = length

    def begin(self, seq: np.ndarray, stop: int) -> None:
        """Nothing to prepare: the matcher reads the sequence itself."""

    def propose(self, seq: np.ndarray, stop: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
        out, lens, count = match_continuations(seq, stop, self.match_min, self.match_max,
                                               self.length, limit)
        return out[:count], lens[:count]

    def observe(self, seq: np.ndarray, start: int, stop: int) -> None:
        """Nothing to update: new tokens are in seq already."""
