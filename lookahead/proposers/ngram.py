"""The n-gram pool proposer: first token -> recent n-grams (Numba kernels in kernels/pool.py)."""

from __future__ import annotations

import numpy as np

from ..core.arrays import contiguous
from ..core.learner import DecayedScalar
from ..kernels.pool import new_pool, pool_insert_grams, pool_insert_sequence, pool_lookup
from .base import Candidates, Outcome, Source, State, StepContext, no_candidates

POOL_PRIORS = np.array([0.3, 0.2, 0.15, 0.1])  # by recency rank in the pool (rank >= 3 shares the last)
COLUMN_PRIOR = (1.0, 20.0)  # (tokens, column-steps): a window column starts worth 0.05 tokens a step, enough
# to feed the window where rows are nearly free, too little to pay for rows that cost
COLUMN_DECAY = 0.98  # weight of the past per step: about the last 50 steps count, so the worth follows the text


class NgramPool:
    """Bounded, de-duplicated LRU pool of N-grams keyed by their first token."""

    def __init__(self, vocab: int, ngram: int, capacity: int, max_keys: int):
        self.ngram = ngram
        self.vocab = vocab
        self.capacity = capacity
        self.max_keys = max_keys
        self.clear()

    def clear(self) -> None:
        """Forget everything."""
        rows = min(self.max_keys, self.vocab)
        (self.slot_of, self.key_of, self.grams, self.gram_stamp,
         self.row_stamp, self.clock) = new_pool(self.vocab, rows, self.capacity, self.ngram - 1)

    def insert_grams(self, full: np.ndarray) -> None:
        """Insert full[M, N] n-grams."""
        pool_insert_grams(full, self.slot_of, self.key_of, self.grams, self.gram_stamp,
                          self.row_stamp, self.clock)

    def insert_sequence(self, seq: np.ndarray, start: int, stop: int) -> None:
        """Insert every n-gram of seq[:stop] that starts at or after start."""
        pool_insert_sequence(seq, start, stop, self.slot_of, self.key_of, self.grams,
                             self.gram_stamp, self.row_stamp, self.clock)

    def lookup(self, key: int, limit: int) -> np.ndarray:
        """Up to limit continuations [k, N-1] of key, most recent first."""
        return pool_lookup(key, limit, self.slot_of, self.grams, self.gram_stamp)

    @property
    def size(self) -> int:
        """Number of n-grams held."""
        return int((self.gram_stamp > 0).sum())


class NgramProposer(Source):
    """Proposes the pool's n-grams that start with x; fed by the prompt, the output
    and (through ``insert_grams``) the Jacobi lookahead window."""

    name = "ngram"
    priors = POOL_PRIORS

    def __init__(self, pool: NgramPool, seed_from_prompt: bool, seed_from_output: bool):
        self.pool = pool
        self.seed_from_prompt = seed_from_prompt
        self.seed_from_output = seed_from_output
        self.ranks = self.lens = np.zeros(0, dtype=np.int64)  # per row of a lookup: its class, its length
        self.classes = np.zeros((0, 0), dtype=np.int64)  # [G, N-1] ranks repeated along each row

    def begin(self, seq: np.ndarray, stop: int) -> None:
        self.pool.clear()
        if self.seed_from_prompt:
            self.pool.insert_sequence(seq, 0, stop)

    def propose(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray,
                step: StepContext | None = None) -> Candidates:
        cands = self.pool.lookup(int(seq[stop - 1]), limit)  # [G, N-1], most recent first
        count = cands.shape[0]
        if count == 0:
            return no_candidates()
        if self.ranks.shape[0] < count:  # (made once: every numpy call of a step's host work costs)
            self.ranks = np.minimum(np.arange(count), POOL_PRIORS.shape[0] - 1)  # [G] each row's class
            self.lens = np.full(count, cands.shape[1], dtype=np.int64)  # [G] every row is a whole n-gram
            self.classes = np.repeat(self.ranks[:, None], cands.shape[1], axis=1)  # [G, N-1] its tokens' classes
        return Candidates(contiguous(cands), self.lens[:count], self.classes[:count])  # (read, never written)

    def observe(self, seq: np.ndarray, start: int, stop: int) -> None:
        """Insert the n-grams that end inside the newly accepted tokens."""
        if self.seed_from_output:
            self.pool.insert_sequence(seq, start - self.pool.ngram + 1, stop)


def column_learner() -> DecayedScalar:
    """Accepted tokens only the window's n-grams proposed, over window columns fed, both decayed.

    A ratio of decayed sums: the n-grams pay off steps after the columns
    that made them, so the worth is what they added lately per column fed
    lately, not per step.
    """
    return DecayedScalar(*COLUMN_PRIOR, COLUMN_DECAY)


class WindowProposer(NgramProposer):
    """Proposes the n-grams the Jacobi window's columns produced (a pool of their own), so that
    their acceptance, and with it what feeding the window is worth, is measured apart."""

    name = "window"

    def __init__(self, pool: NgramPool):
        super().__init__(pool, seed_from_prompt=False, seed_from_output=False)

    def learn(self, outcome: Outcome) -> None:
        """The step fed ``outcome.width`` columns; count the accepted tokens that came from the
        window's n-grams alone (nodes of this source's classes: no earlier source had them)."""
        outcome.state(column_learner).step(int(outcome.mine[outcome.path].sum()), outcome.width)

    def column_worth(self, state: State) -> float:
        """Tokens one window column fed for one step is worth, later, through its n-grams."""
        return state(column_learner).value()
