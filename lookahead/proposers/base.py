"""The Proposer protocol every candidate source implements, and what a source is told.

A source is asked once a step for candidates (``propose``, with a ``StepContext``)
and told afterwards what came of the verified tree (``learn``, with an
``Outcome``). What it learns from step to step and must keep across generate
calls (per regime: plan/planner.py) it keeps in its ``State``, a slot of its own
in the acceptance table. A new source is one new file (a ``Source`` subclass)
and a line in decode/sources.py; the planner names no source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch

from ..core.arrays import contiguous

if TYPE_CHECKING:
    from ..core.tree import TokenTree

State = Callable[[Callable[[], Any]], Any]  # state(factory): the source's learned state in this regime,
# made by factory() the first time (AcceptanceStats.state under the source's name)


@dataclass(frozen=True)
class Candidates:
    """Continuations of x from one source (G rows, each valid up to lens[g] tokens).

    ``classes[g, d]`` is the source's own label of token d of row g (0 ..
    len(Proposer.priors) - 1): acceptance is tracked per (source, class, depth),
    so a source can tell apart e.g. long and short context matches.

    ``q`` is set by a source that DREW row 0's tokens at random (a draft
    model under sampling): q[d] is the distribution token d was drawn from,
    on the device. Such a row is verified with min(1, p/q) (verify/verifier.py)
    and stays its own branch of the tree (plan/planner.py). ``seconds`` is what
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


@lru_cache(maxsize=8)
def no_candidates(length: int = 1) -> Candidates:
    """No rows (one read-only instance per length: a step asks for it several times, and every numpy
    call of a step's host work pays a fixed cost on a CPU whose caches the forward just flushed)."""
    empty = np.zeros((0, length), dtype=np.int64)
    empty.flags.writeable = False
    lens = np.zeros(0, dtype=np.int64)
    lens.flags.writeable = False
    return Candidates(empty, lens, empty)


def single_class(tokens: np.ndarray, lens: np.ndarray, labels: np.ndarray) -> Candidates:
    """Candidates whose tokens all carry their row's label labels[G]."""
    classes = np.empty(tokens.shape, dtype=np.int64)  # [G, L]
    classes[...] = labels[:, None]
    return Candidates(contiguous(tokens), contiguous(lens), classes)


@dataclass(frozen=True)
class Others:
    """What the other sources' candidates already reach this step (``StepContext.others``)."""

    tree: TokenTree  # their scored trie
    covered: np.ndarray  # [D] its best path probability at depth d + 1 (0 where none)
    plain: tuple[float, float]  # (expected tokens, cost in plain target steps) of the step verifying it alone,
    # sized by the budget: what a source that costs time must beat ((1, 1) without a cost model)


@dataclass(slots=True)
class StepContext:
    """What a source is told when asked for this step's candidates, beside the sequence."""

    tokens_left: int  # tokens that may still be appended (nothing deeper is ever verified)
    state: State  # this source's learned state, kept across generate calls
    others: Callable[[], Others]  # asks the other sources first (once) and says what they reach
    unit: Callable[[], float]  # seconds of a plain target step (x alone), the unit of every cost in
    # plain steps; 0.0 without a cost model


class Outcome:
    """What one verified step did, as one source sees it (``Proposer.learn``)."""

    def __init__(self, tree: TokenTree, path: np.ndarray, width: int, block: tuple[int, int], state: State,
                 price: Callable[[], float]):
        """``block``: (first, end) of this source's rows in the shared estimate table; ``price()``:
        the step's cost in plain target steps."""
        self.tree = tree  # the verified tree
        self.path = path  # [k] its accepted nodes, in depth order
        self.width = width  # window columns the step fed
        self.state = state
        self.block = block
        self._price = price

    @cached_property
    def mine(self) -> np.ndarray:
        """[M] whether each node of the tree is this source's (carries one of its classes)."""
        first, end = self.block
        return (self.tree.classes >= first) & (self.tree.classes < end)

    @cached_property
    def classes(self) -> np.ndarray:
        """[M] each node's class as this source numbers them (meaningful where ``mine``)."""
        return self.tree.classes - self.block[0]

    @cached_property
    def steps(self) -> float:
        """The step's cost in plain target steps, priced by the planner's cost curve (1.0 without one)."""
        return self._price()


@runtime_checkable
class Proposer(Protocol):
    """A source of candidate continuations of the last accepted token x.

    ``seq[:stop]`` is prompt + output so far; its last token is x. ``priors``
    [classes] is the acceptance rate assumed for each class before any is
    measured; ``estimates`` [classes, D] passed to propose is the current
    estimate per class and depth (a source may use it to shape its tree).
    ``name`` keys the source's learned state (``State``): unique per source.
    """

    name: str
    priors: np.ndarray

    def begin(self, seq: np.ndarray, stop: int) -> None:
        """Start a new sequence whose prompt is seq[:stop]."""

    def propose(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray,
                step: StepContext) -> Candidates:
        """Up to ``limit`` continuations of seq[:stop]."""

    def observe(self, seq: np.ndarray, start: int, stop: int) -> None:
        """seq[start:stop] was just accepted."""

    def learn(self, outcome: Outcome) -> None:
        """The step the source proposed for was verified (called every step, proposed or not)."""

    def finish(self, seq: np.ndarray, stop: int) -> None:
        """The sequence ended as seq[:stop] (EOS, budget or a stop): the last call for it."""

    def column_worth(self, state: State) -> float:
        """Tokens one window column fed for one step is worth to this source, later (0: none)."""


class Source:
    """The parts of the protocol most sources leave as they are: nothing to begin, observe, learn
    or keep when a sequence finishes, and feeding the window is worth nothing to them. A source subclasses it, sets
    ``name`` and ``priors`` and writes ``propose``."""

    name = ""
    priors: np.ndarray

    def begin(self, seq: np.ndarray, stop: int) -> None:
        """Nothing to prepare."""

    def observe(self, seq: np.ndarray, start: int, stop: int) -> None:
        """Nothing to update."""

    def learn(self, outcome: Outcome) -> None:
        """Nothing to learn."""

    def finish(self, seq: np.ndarray, stop: int) -> None:
        """Nothing to keep."""

    def column_worth(self, state: State) -> float:
        """Window columns are worth nothing to this source."""
        return 0.0


def acts(source: Proposer, method: str) -> bool:
    """Whether ``source``'s ``method`` ("begin", "observe", "learn", ...) may do anything: False only where
    it is ``Source``'s own no-op, so that a loop calling it every step can leave such sources out."""
    return getattr(type(source), method, None) is not getattr(Source, method)
