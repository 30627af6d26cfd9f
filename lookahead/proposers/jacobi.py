"""The Jacobi lookahead window: N-1 levels of W guesses, refined every step.

Every step the model's argmax at each last-level row becomes the new last
level; the oldest level drops out. Column i then yields the n-gram
(level_0[i], ..., level_{N-2}[i], new[i]) for the pool. Level 0, column 0 is
always the current x.
"""

from __future__ import annotations

import numpy as np


class JacobiWindow:
    """State of the 2-D lookahead window; levels[N-1, W] int64."""

    def __init__(self, window: int, ngram: int, seed: int):
        self.window = window
        self.ngram = ngram
        self.rng = np.random.default_rng(seed)
        self.levels = np.zeros((ngram - 1, window), dtype=np.int64)  # [N-1, W]

    def begin(self, prompt: np.ndarray) -> None:
        """Start from guesses drawn from the prompt's tokens (LADE-style)."""
        self.levels = self.rng.choice(prompt, size=(self.ngram - 1, self.window)).astype(np.int64)

    def rows(self, x: int) -> np.ndarray:
        """The window's tokens [W*(N-1)], level by level, with x at row 0."""
        self.levels[0, 0] = x
        return self.levels.reshape(-1)

    def last_level_rows(self) -> np.ndarray:
        """Row indices [W] of the last level (whose outputs form the next level)."""
        return (self.ngram - 2) * self.window + np.arange(self.window)

    def advance(self, new_level: np.ndarray) -> np.ndarray:
        """Shift in the model's argmax new_level[W]; the column n-grams [W, N]."""
        grams = np.concatenate([self.levels.T, new_level[:, None]], axis=1)  # [W, N]
        self.levels = np.concatenate([self.levels[1:], new_level[None, :]], axis=0)  # [N-1, W]
        return grams
