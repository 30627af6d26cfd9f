"""The Proposer protocol every candidate source implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch


@dataclass(frozen=True)
class Candidates:
    """Continuations of x from one source (G rows, each valid up to lens[g] tokens).

    ``classes[g, d]`` is the source's own label of token d of row g (0 ..
    len(Proposer.priors) - 1): acceptance is tracked per (source, class, depth),
    so a source can tell apart e.g. long and short context matches.

    ``q`` is set by a source that DREW row 0's tokens at random (a draft
    model under sampling): q[d] is the distribution token d was drawn from,
    on the device. Such a row is verified with min(1, p/q) (verify.py) and
    stays its own branch of the tree (planner.py). ``seconds`` is what
    proposing cost beyond host work the loop already times (a draft's forwards);
    ``catch_up`` the part of it that was a one-off (a draft reading text it
    had not seen, beyond one row), which the draft's measured rate leaves out.
    """

    tokens: np.ndarray  # [G, L] int64
    lens: np.ndarray  # [G] int64, >= 1
    classes: np.ndarray  # [G, L] int64
    q: torch.Tensor | None = None  # [L, V] distributions row 0 was drawn from, or None (chosen, not drawn)
    seconds: float = 0.0
    catch_up: float = 0.0  # of seconds, a one-off catch-up's share

    @property
    def count(self) -> int:
        return int(self.tokens.shape[0])


def no_candidates(length: int = 1) -> Candidates:
    """No rows."""
    empty = np.zeros((0, length), dtype=np.int64)
    return Candidates(empty, np.zeros(0, dtype=np.int64), empty)


def single_class(tokens: np.ndarray, lens: np.ndarray, labels: np.ndarray) -> Candidates:
    """Candidates whose tokens all carry their row's label labels[G]."""
    classes = np.repeat(labels.astype(np.int64)[:, None], tokens.shape[1], axis=1)  # [G, L]
    return Candidates(tokens.astype(np.int64), lens.astype(np.int64), classes)


@runtime_checkable
class Proposer(Protocol):
    """A source of candidate continuations of the last accepted token x.

    ``seq[:stop]`` is prompt + output so far; its last token is x. ``priors``
    [classes] is the acceptance rate assumed for each class before any is
    measured; ``estimates`` [classes, D] passed to propose is the current
    estimate per class and depth (a source may use it to shape its tree).

    A source that spends forwards (``asks_coverage = True``, a draft model)
    also gives ``cost_ratio(rows)``, its forward in plain target steps, and is
    asked last, with ``covered``, ``plain``, ``rate`` and ``room`` keywords
    (planner.py, proposers/draft.py).
    """

    name: str
    priors: np.ndarray

    def begin(self, seq: np.ndarray, stop: int) -> None:
        """Start a new sequence whose prompt is seq[:stop]."""

    def propose(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray) -> Candidates:
        """Up to ``limit`` continuations of seq[:stop]."""

    def observe(self, seq: np.ndarray, start: int, stop: int) -> None:
        """seq[start:stop] was just accepted."""
