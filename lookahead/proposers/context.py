"""Context matcher: propose what followed earlier occurrences of the current suffix."""

from __future__ import annotations

import numpy as np

from ..kernels.match import match_continuations
from .base import Candidates, Source, StepContext, no_candidates, single_class

# Matches of length 1, 2, 3, 4-5, 6-8, 9-15, 16+ are told apart: the longer the
# match, the longer the copy that usually follows.
MATCH_BUCKETS = np.array([2, 3, 4, 6, 9, 16], dtype=np.int64)  # bucket = count of edges <= length
MATCH_PRIORS = np.array([0.15, 0.35, 0.5, 0.6, 0.7, 0.85, 0.9])


class ContextMatcher(Source):
    """Prompt lookup generalised: the longest suffix (match_max .. match_min tokens)
    of prompt + output that occurred before proposes up to ``length`` tokens of
    its continuation; each token is labelled by the full match length. It reads the sequence
    itself: nothing to begin or observe (``Source``'s)."""

    name = "context"
    priors = MATCH_PRIORS

    def __init__(self, match_min: int, match_max: int, length: int):
        self.match_min = match_min
        self.match_max = match_max
        self.length = length

    def propose(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray,
                step: StepContext | None = None) -> Candidates:
        out, lens, matched, count = match_continuations(seq, stop, self.match_min, self.match_max,
                                                        self.length, limit)
        if count == 0:
            return no_candidates()
        labels = MATCH_BUCKETS.searchsorted(matched[:count], side="right")  # [G]
        return single_class(out[:count], lens[:count], labels)
