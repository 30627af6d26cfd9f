"""Telling a serving engine's requests apart by their tokens alone.

vLLM hands a custom proposer each step the rows of its input batch (every running request's prompt
and output so far, ``token_ids[i, :lengths[i]]``) and the tokens each accepted this step, but no
request ids, and a row changes hands as requests finish and the batch is condensed. A
``RequestTracker`` keeps one state per request and matches every row of a step to the state whose
tokens it continues: the state that held the same row, else any state of that length whose tokens
agree (a request moved to another row), else a new request. A state no row continued this step
has finished (or left the batch): it is handed back once, to be finished.

Agreement is checked on the ends of the history (``CHECKED`` tokens at each end and the length),
so two requests with the same prompt are told apart by their rows while both run. Worked example:
step 1, row 0 holds [5 6 7] (a prompt of 2 and its first token 7): a new request. Step 2, row 0
holds [5 6 7 8]: the same request (length 3 + 1 accepted, tokens agree). Step 3, row 0 holds
[9 9 4]: the first request finished, a new one began.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

CHECKED = 16  # tokens compared at each end of a request's history when matching a row to it

S = TypeVar("S")


@dataclass(eq=False)  # (told apart by identity: two requests may hold the same tokens)
class Tracked(Generic[S]):
    """One request: its tokens so far (int64, a buffer grown as it goes) and the caller's state."""

    buffer: np.ndarray  # [capacity] int64; the first ``length`` are the request's tokens
    length: int
    state: S
    row: int = -1  # the batch row that held it last

    @property
    def tokens(self) -> np.ndarray:
        """[length] the request's tokens so far."""
        return self.buffer[:self.length]

    def agrees(self, row: np.ndarray, length: int) -> bool:
        """Whether row[:length] holds this request's tokens (ends and length checked)."""
        if length != self.length:
            return False
        head = min(CHECKED, length)
        tail = max(length - CHECKED, head)
        return bool(np.array_equal(row[:head], self.buffer[:head])
                    and np.array_equal(row[tail:length], self.buffer[tail:length]))

    def extend(self, new: np.ndarray) -> None:
        """Append new tokens [n]."""
        end = self.length + new.shape[0]
        if end > self.buffer.shape[0]:
            grown = np.empty(max(end, 2 * self.buffer.shape[0]), dtype=np.int64)
            grown[:self.length] = self.buffer[:self.length]
            self.buffer = grown
        self.buffer[self.length:end] = new
        self.length = end


@dataclass
class Step(Generic[S]):
    """What one step's rows were: the request of each row that has one, the requests that began and
    those that ended."""

    requests: dict[int, Tracked[S]] = field(default_factory=dict)  # row -> its request
    begun: list[Tracked[S]] = field(default_factory=list)
    ended: list[Tracked[S]] = field(default_factory=list)


class RequestTracker(Generic[S]):
    """The requests of a batch, told apart by their tokens; ``new_state`` makes a new request's state."""

    def __init__(self, new_state: Callable[[], S]):
        self.new_state = new_state
        self.live: list[Tracked[S]] = []

    def step(self, rows: list[tuple[int, np.ndarray, int, int]]) -> Step[S]:
        """Match this step's rows (row index, its tokens [>= length], length, tokens accepted this
        step) to requests; every live request no row continued has ended."""
        out: Step[S] = Step()
        free = list(self.live)
        for index, row, length, accepted in rows:
            before = length - accepted
            found = self._match(free, index, row, before)
            if found is None:
                found = Tracked(np.array(row[:length], dtype=np.int64), length, self.new_state(), index)
                out.begun.append(found)
            else:
                free.remove(found)
                found.extend(np.asarray(row[before:length], dtype=np.int64))
            found.row = index
            out.requests[index] = found
        out.ended = free
        self.live = list(out.requests.values())
        return out

    def finish_all(self) -> list[Tracked[S]]:
        """Every live request, ended (the engine is shutting down)."""
        ended, self.live = self.live, []
        return ended

    @staticmethod
    def _match(free: list[Tracked[S]], index: int, row: np.ndarray, before: int) -> Tracked[S] | None:
        """The live request row[:before] continues: the one that held this row first, else any."""
        same_row = [t for t in free if t.row == index]
        for tracked in same_row + [t for t in free if t.row != index]:
            if tracked.agrees(row, before):
                return tracked
        return None
