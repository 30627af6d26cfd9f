"""A server's start-up work done before its first request: the step shapes its batches will run, traced.

A fresh process pays once for each kind of step it meets: the cost curve of each batch size (where the disk
holds none, an open batch prices that size by a stand-in and the curve is measured later, when the server
is idle: cost/policy.py) and, with a traced forward (model/traced.py), a
check of the trace at each new shape (a batch size of one or of several, a step of one row or of
several), a fraction of a second each for a small model. Left to the first requests, that work
stalls every sequence in their batches; done here, before the port opens, it is paid at start.

``warm_up`` joins synthetic prompts to a batch of 1, 2 and 3 sequences (two sizes of several serve
every larger one, ``TracedForward.serves``) and runs one step of one row and one of two rows for each
through the target, as the decode loop would, then drops the batch and measures the curves of those batch
sizes that the disk did not hold: nothing is decoded, nothing is learned (no acceptance, no curve refinement,
no memory, no kept prompt), only the curves, routes and traces are made. A larger batch's curve is measured
when the server is first idle after such a batch ran (serve/engine.py), or ahead with ``lookahead costs
measure --batch-size N``.
Where the grammar engine is installed and the generator has a tokenizer, it also compiles the JSON-object
grammar, which makes the grammar engine's table of the vocabulary's tokens (the slow part of a first compile
on a large vocabulary), so that the first request with a ``response_format`` or a forced tool call does not
wait for it; where that compile fails, the warm-up goes on and that first request compiles (and reports).

``settle_heap`` then hands the objects alive at that point (the model, its tokenizer, the traces, the library
modules: hundreds of thousands of them) to the garbage collector's permanent generation (``gc.freeze``).
Without it the process's first full collection while serving walks every one of them with the GIL held, a
stall of every stream in the batch at once (the decode thread and the HTTP thread both wait on it); after it,
a full collection walks only what serving made. ``unsettle_heap`` hands them back when serving ends, so that
the interpreter's finalization collects them as it would have (libraries that count their objects at exit,
nanobind's, otherwise report every frozen one as leaked).

Worked example (``max_batch`` 4, SmolLM2 traced): shapes (1, 1), (1, 2+), (2, 1), (2, 2+), (3, 1),
(3, 2+) checked; a step of 4 sequences over 3 rows then replays its trace at once.
"""

from __future__ import annotations

import gc
import importlib.util
import time
from dataclasses import dataclass

import numpy as np
import torch

from .. import GrammarInputError, LookaheadGenerator

PROMPT_TOKENS = 16  # a synthetic prompt's length
BATCHES = 3  # batch sizes 1 .. BATCHES are warmed (fewer where max_batch is smaller)
ROWS = (1, 2)  # a step's row classes: one row, several


@dataclass(frozen=True)
class WarmUp:
    """What ``warm_up`` ran: the (sequences, rows) of its steps and the seconds it took."""

    shapes: tuple[tuple[int, int], ...]
    seconds: float
    grammar: bool = False  # the grammar engine's token table was made (see the module's docstring)


def warm_up(generator: LookaheadGenerator, max_batch: int) -> WarmUp:
    """Run one step of every (batch size, row class) a server of ``max_batch`` sequences meets first (see the
    module's docstring) on throwaway batches of synthetic prompts."""
    began = time.perf_counter()
    prompt = np.arange(1, PROMPT_TOKENS + 1, dtype=np.int64) % max(generator.vocab, 1)  # [T]
    shapes = []
    with torch.inference_mode():
        for count in range(1, min(BATCHES, max_batch) + 1):
            for rows in ROWS:
                _step(generator, prompt, count, rows)
                shapes.append((count, rows))
    while generator.measure_pending() is not None:
        pass
    if generator.prefixes is not None:
        generator.prefixes.clear()  # (its synthetic prompts are nothing a request resends)
    grammar = _grammar(generator)
    return WarmUp(tuple(shapes), time.perf_counter() - began, grammar)


def settle_heap() -> int:
    """Collect what start-up left behind, then freeze every object still alive out of the collector's view (see
    the module's docstring): for a process that serves from here on (``lookahead serve`` calls it once, after
    ``warm_up``). Returns how many objects the collector no longer walks."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unsettle_heap() -> None:
    """Give the objects ``settle_heap`` froze back to the collector (``gc.unfreeze``): when serving has ended,
    before the interpreter finalizes (see the module's docstring)."""
    gc.unfreeze()


def _grammar(generator: LookaheadGenerator) -> bool:
    """Compile the JSON-object grammar where the grammar engine and a tokenizer are there (the engine's token
    table, made once, serves every later constraint); whether it was compiled."""
    if generator.tokenizer is None or importlib.util.find_spec("xgrammar") is None:
        return False
    try:
        generator.grammar("json_object")
    except (GrammarInputError, RuntimeError, ValueError, TypeError):
        return False  # (the grammar engine cannot read this tokenizer: a constrained request says so, as a 400)
    return True


def _step(generator: LookaheadGenerator, prompt: np.ndarray, count: int, rows: int) -> None:
    """``count`` sequences on ``prompt`` join a new batch; one step of ``rows`` rows each through the target."""
    batch = generator.open_batch()
    for _ in range(count):
        batch.join(prompt, max_new_tokens=rows + 1, do_sample=False)
    batch.trial_step(rows)  # a chain of each prompt's last ``rows`` tokens, nothing committed
