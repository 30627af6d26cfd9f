"""The Jacobi lookahead window: N-1 levels of W guesses, refined every step.

Every step the model's argmax at each last-level row becomes the new last
level; the oldest level drops out. Column i then yields the n-gram
(level_0[i], ..., level_{N-2}[i], new[i]) for the pool. Level 0, column 0 is
always the current x. The window owns its rows of the step: their tokens,
positions (offsets from x) and which of them see which (``window_layout``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=64)
def window_layout(window: int, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets [W*(N-1)] and mask [W*(N-1), W*(N-1)] of the lookahead window.

    Built once per (W, N) and cached (the decode loop asks every step);
    callers copy the arrays, never write to them.

    Level 0 is a causal chain (x, a1, ..., a_{W-1}) at offsets 0..W-1. Level
    l >= 1, column i sits at offset i + l and sees level 0 up to column i plus
    the same column of levels 1..l.
    """
    levels = ngram - 1
    rows = window * levels
    level = np.repeat(np.arange(levels), window)  # [R]
    column = np.tile(np.arange(window), levels)  # [R]
    offsets = (level + column).astype(np.int64)
    sees_level0 = (level[None, :] == 0) & (column[None, :] <= column[:, None])  # [R, R]
    same_column = (column[None, :] == column[:, None]) & (level[None, :] >= 1) & (level[None, :] <= level[:, None])
    mask = sees_level0 | same_column
    assert mask.shape == (rows, rows)
    offsets.flags.writeable = mask.flags.writeable = False  # shared by the cache
    return offsets, mask


class JacobiWindow:
    """State of the 2-D lookahead window; levels[N-1, W] int64."""

    def __init__(self, window: int, ngram: int, seed: int):
        self.window = window
        self.ngram = ngram
        self.rng = np.random.default_rng(seed)
        self.levels = np.zeros((ngram - 1, window), dtype=np.int64)  # [N-1, W]
        last = (ngram - 2) * window + np.arange(window)  # [W] rows of the last level
        # Rows whose logits a step keeps, x (row 0) first: the last level, after x unless it holds x.
        self.kept_rows = last if ngram == 2 else np.concatenate([[0], last])  # [1 + W] or [W]

    @property
    def size(self) -> int:
        """Rows of the window in a step, x included: W * (N - 1)."""
        return self.window * (self.ngram - 1)

    def layout(self) -> tuple[np.ndarray, np.ndarray]:
        """Offsets [W*(N-1)] and local mask of the window's rows (read-only, shared)."""
        return window_layout(self.window, self.ngram)

    def begin(self, prompt: np.ndarray) -> None:
        """Start from guesses drawn from the prompt's tokens (LADE-style)."""
        self.levels = self.rng.choice(prompt, size=(self.ngram - 1, self.window)).astype(np.int64)

    def rows(self, x: int) -> np.ndarray:
        """The window's tokens [W*(N-1)], level by level, with x at row 0."""
        self.levels[0, 0] = x
        return self.levels.reshape(-1)

    def advance(self, new_level: np.ndarray) -> np.ndarray:
        """Shift in the model's argmax new_level[W]; the column n-grams [W, N]."""
        grams = np.concatenate([self.levels.T, new_level[:, None]], axis=1)  # [W, N]
        self.levels = np.concatenate([self.levels[1:], new_level[None, :]], axis=0)  # [N-1, W]
        return grams
