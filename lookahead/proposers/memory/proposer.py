"""Memory across requests: a generator remembers the text of its earlier requests in a suffix store
(store.py) and proposes what followed the longest match of the current suffix there.

Agents, tool calls, SQL and code edits repeat themselves from one request to
the next; the context matcher and the n-gram pool see only the current one.
The store keeps every finished request's output, after the last PROMPT_TAIL
tokens of its prompt (what a reply starts after: a chat template's tail; the
whole prompt with ``memory_prompts``), for the generator's lifetime, bounded by
``memory_tokens``, oldest requests evicted first; ``RequestMemory.save`` /
``load`` keep it on disk (file.py). A look-up finds the longest indexed
suffix (kernels/suffix.py ORDERS) that occurred before and merges what
followed each occurrence into a trie whose nodes count the occurrences
through them. A token's class is (match order, its share of the
occurrences that reached the token before it), so the budget learns how
far each kind of match is worth trusting: a long match that always went on
the same way is copied deep, a short one that went several ways barely.
"""

from __future__ import annotations

import os
import time

import numpy as np

from ...kernels.suffix import ORDERS, PROB_EDGES
from ..base import Candidates, Source, StepContext, no_candidates
from . import file
from .store import MATCH_CAP, SuffixStore

SHARE_MIDDLES = np.array([0.1, 0.35, 0.55, 0.75, 0.95])  # a typical share of the occurrences in each bucket
PROMPT_TAIL = 8  # the prompt tokens kept before an output: what a reply starts after (a chat template's tail)
ORDER_TRUST = np.array([0.5, 0.6, 0.7, 0.8, 0.85, 0.9])  # how often a continuation of each match order holds


def memory_priors() -> np.ndarray:
    """Assumed acceptance [O * B] of a token of match order o in share bucket b, before any is
    measured: how often that order's continuations hold, times the share's typical value."""
    assert SHARE_MIDDLES.shape[0] == PROB_EDGES.shape[0] + 1 and ORDER_TRUST.shape[0] == ORDERS.shape[0]
    return (ORDER_TRUST[:, None] * SHARE_MIDDLES[None, :]).reshape(-1)


class RequestMemory:
    """A generator's memory of its earlier requests: the store, what goes into it, the host time spent.

    ``vocabulary`` ties saved files to the tokenizer (file.vocabulary_key); ``vocab`` bounds the ids.
    """

    priors = memory_priors()

    def __init__(self, capacity: int, prompts: bool, vocabulary: str, vocab: int):
        self.store = SuffixStore(capacity)
        self.prompts = prompts
        self.vocabulary, self.vocab = vocabulary, vocab
        self.seconds = 0.0  # host time spent looking up and storing, all calls together

    def begin(self, seq: np.ndarray, stop: int) -> None:
        """A request whose prompt is seq[:stop] starts (the store learns only when it ends)."""

    def observe(self, seq: np.ndarray, start: int, stop: int) -> None:
        """seq[start:stop] was just accepted (the store learns only when the request ends)."""

    def lookup(self, seq: np.ndarray, stop: int, limit: int, length: int) -> Candidates:
        """Up to ``limit`` continuations of seq[:stop] from earlier requests, at most ``length`` long."""
        began = time.perf_counter()
        tokens, lens, classes, _ = self.store.lookup(seq, stop, limit, length)
        self.seconds += time.perf_counter() - began
        return Candidates(tokens, lens, classes) if lens.shape[0] else no_candidates()

    def remember(self, seq: np.ndarray, prompt_len: int, stop: int) -> None:
        """A request ended as seq[:stop] after a prompt of prompt_len tokens: keep its output after the
        prompt's last PROMPT_TAIL tokens (the whole prompt with ``prompts``)."""
        began = time.perf_counter()
        self.store.add(seq[0 if self.prompts else max(prompt_len - PROMPT_TAIL, 0):stop])
        self.seconds += time.perf_counter() - began

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write what the store holds to path (atomically; file.py). A path in a directory that does not
        exist is refused (MemoryFileError naming it and the fix), not created (``file.check_path``, a check
        the commands' ``--memory`` can share)."""
        file.write(path, self.store.held(), self.vocabulary)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Replace what the store holds with the requests saved at path (refused whole when the file
        fails a check: the store is then left as it was)."""
        requests = file.read(path, self.vocabulary, self.vocab)
        store = SuffixStore(self.store.capacity)
        for tokens in requests:
            store.add(tokens)
        self.store = store


class MemoryProposer(Source):
    """Proposes what followed the current suffix in earlier requests (a ``RequestMemory``, or any
    object with its begin / observe / lookup / remember and priors)."""

    name = "memory"

    def __init__(self, memory: RequestMemory, length: int = MATCH_CAP):
        self.memory = memory
        self.length = length
        self.priors = memory.priors
        self.prompt_len = 0

    def begin(self, seq: np.ndarray, stop: int) -> None:
        self.prompt_len = stop
        self.memory.begin(seq, stop)

    def propose(self, seq: np.ndarray, stop: int, limit: int, estimates: np.ndarray,
                step: StepContext) -> Candidates:
        if limit <= 0:
            return no_candidates()
        return self.memory.lookup(seq, stop, limit, self.length)  # the planner cuts rows past tokens_left

    def observe(self, seq: np.ndarray, start: int, stop: int) -> None:
        self.memory.observe(seq, start, stop)

    def finish(self, seq: np.ndarray, stop: int) -> None:
        """The request is done: the memory keeps it."""
        self.memory.remember(seq, self.prompt_len, stop)
