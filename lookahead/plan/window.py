"""The Jacobi lookahead window: N-1 levels of W guesses, refined every step it is fed.

Every step the model's argmax at each last-level row becomes the new last
level; the oldest level drops out. Column i then yields the n-gram
(level_0[i], ..., level_{N-2}[i], new[i]) for the pool. Level 0, column 0 is
always the current x. The window owns its rows of the step: their tokens,
positions (offsets from x) and which of them see which (``window_layout``).

A step may feed only the first w columns (the budget picks w, planner.py and budget.py):
those advance, the others keep their guesses until a step feeds them again
(a stale guess only makes a worse n-gram; n-grams are verified anyway).
w = 0 feeds x alone: no window at all this step.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np

from ..config import LookaheadConfig
from ..cost import CostModel

AUTO_WINDOW = (15, 5)  # (W, N) of the window auto_window opens: LADE's GPU setting, where rows are nearly free
CHEAP_STEP = 1.3  # auto_window opens it where a step over 1 + max_tree_nodes rows costs at most this many
# one-row steps: only there can the budget afford to feed it


def auto_window(config: LookaheadConfig, cost: CostModel | None) -> LookaheadConfig:
    """The config a decode runs with: ``config`` itself, or with the AUTO_WINDOW window where
    ``config.auto_window`` asks for one (window=1 and an adaptive budget) and the cost curve
    ``cost`` (a CostModel, or None) prices a step over 1 + max_tree_nodes rows at most
    CHEAP_STEP one-row steps: rows are nearly free there, so the budget may feed the window.

    A curve pricing 33 rows at 3 one-row steps -> config; a flat curve -> W=15, N=5.
    """
    if not config.auto_window or config.window != 1 or config.budget != "adaptive" or cost is None:
        return config
    step = cost.step(np.array([1.0, 1.0 + config.max_tree_nodes]))  # [2] seconds
    if step[1] > CHEAP_STEP * step[0]:
        return config
    window, ngram = AUTO_WINDOW
    return dataclasses.replace(config, window=window, ngram=ngram)


@lru_cache(maxsize=64)
def window_layout(window: int, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Offsets [W*(N-1)] and mask [W*(N-1), W*(N-1)] of the lookahead window (W = 0: x alone).

    Built once per (W, N) and cached (the decode loop asks every step);
    callers copy the arrays, never write to them.

    Level 0 is a causal chain (x, a1, ..., a_{W-1}) at offsets 0..W-1. Level
    l >= 1, column i sits at offset i + l and sees level 0 up to column i plus
    the same column of levels 1..l.
    """
    if window == 0:
        offsets, mask = np.zeros(1, dtype=np.int64), np.ones((1, 1), dtype=bool)
        offsets.flags.writeable = mask.flags.writeable = False
        return offsets, mask
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


def window_rows(width: int, ngram: int) -> int:
    """Rows a window of ``width`` columns takes in a step, x included (width 0: x alone)."""
    return max(1, width * (ngram - 1))


@lru_cache(maxsize=256)
def kept_window_rows(width: int, ngram: int) -> np.ndarray:
    """Rows whose logits a step keeps, x (row 0) first: the last level's ``width`` rows,
    after x unless the last level holds x (N = 2); [0] for width 0. Cached and read-only, as
    ``window_layout``."""
    if width == 0:
        kept = np.zeros(1, dtype=np.int64)
    else:
        last = (ngram - 2) * width + np.arange(width)  # [w] rows of the last level
        kept = last if ngram == 2 else np.concatenate([[0], last])  # [w] or [1 + w]
    kept.flags.writeable = False
    return kept


class JacobiWindow:
    """State of the 2-D lookahead window; levels[N-1, W] int64."""

    def __init__(self, window: int, ngram: int, seed: int):
        self.window = window
        self.ngram = ngram
        self.rng = np.random.default_rng(seed)
        self.levels = np.zeros((ngram - 1, window), dtype=np.int64)  # [N-1, W]

    def kept_rows(self, width: int) -> np.ndarray:
        """Rows of a ``width``-column step whose logits are kept (``kept_window_rows``)."""
        return kept_window_rows(width, self.ngram)

    def layout(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Offsets [w*(N-1)] and local mask of the first ``width`` columns' rows (read-only, shared)."""
        return window_layout(width, self.ngram)

    def begin(self, prompt: np.ndarray) -> None:
        """Start from guesses drawn from the prompt's tokens (LADE-style)."""
        self.levels = self.rng.choice(prompt, size=(self.ngram - 1, self.window)).astype(np.int64)

    def rows(self, x: int, width: int) -> np.ndarray:
        """The first ``width`` columns' tokens [w*(N-1)], level by level, with x at row 0 ([x] for width 0)."""
        if width == 0:
            return np.array([x], dtype=np.int64)
        self.levels[0, 0] = x
        return self.levels[:, :width].reshape(-1)

    def advance(self, new_level: np.ndarray) -> np.ndarray:
        """Shift the model's argmax new_level[w] into the first w columns; their n-grams [w, N]."""
        width = new_level.shape[0]
        fed = self.levels[:, :width]  # [N-1, w]
        grams = np.concatenate([fed.T, new_level[:, None]], axis=1)  # [w, N]
        self.levels[:, :width] = np.concatenate([fed[1:], new_level[None, :]], axis=0)
        return grams
