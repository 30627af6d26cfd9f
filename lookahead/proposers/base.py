"""The Proposer protocol every candidate source implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


def no_candidates(length: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """An empty (cands[0, L], lens[0]) pair."""
    return np.zeros((0, length), dtype=np.int64), np.zeros(0, dtype=np.int64)


@runtime_checkable
class Proposer(Protocol):
    """A source of candidate continuations of the last accepted token x.

    ``seq[:stop]`` is prompt + output so far; its last token is x.
    """

    name: str

    def begin(self, seq: np.ndarray, stop: int) -> None:
        """Start a new sequence whose prompt is seq[:stop]."""

    def propose(self, seq: np.ndarray, stop: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``limit`` continuations of seq[:stop]: (cands[k, L] int64, lens[k] >= 1)."""

    def observe(self, seq: np.ndarray, start: int, stop: int) -> None:
        """seq[start:stop] was just accepted."""
