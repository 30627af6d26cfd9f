"""The ways ``Target.step`` runs a step's forward, one class each: graphed, replayed from a trace, eager.

``Target.step`` offers a step (``StepCall``) to its ways in order; the first that returns logits [A, K, V]
ran it, and a way that returns None leaves it to the next. Every way runs the same model on the same
inputs, so they differ in host work, not in the numbers:

- ``GraphedStep``: a captured CUDA graph of one sequence's step (graphs.py), where the target has them;
- ``ReplayedStep``: a TorchScript trace made and checked at this step's shape (traced.py), replayed with
  the route's threads alone;
- ``EagerStep``: the model's own forward under the step's route and attention, which first offers the step
  to the traced forward to make or check a trace at a new shape (whose run then is the step's).

The eager and replayed ways read what ``Target.prepare`` puts in the call (the mask, the route, the trace's
key); the graphed way reads the raw arrays.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from .cache import Arena, arena_of
from .routing import Route, route_mode
from .traced import TraceKey, row_class

if TYPE_CHECKING:
    from transformers import Cache

    from .attention import GroupedAttention
    from .fewrows import FewRowLinear
    from .graphs import StepGraphs
    from .mask import PastSlots
    from .traced import TracedForward


@dataclass
class StepCall:
    """One step of A sequences over Q rows each, as ``Target.step`` takes it, and what ``Target.prepare``
    derives from it once (None until then)."""

    cache: Cache
    tokens: np.ndarray  # [A, Q]
    positions: np.ndarray  # [A, Q]
    local: np.ndarray  # [A, Q, Q]
    keep: np.ndarray  # [K]
    past: int
    slots: PastSlots | None
    horizon: int = 0  # most steps the call may still run, this one included (0: not known); traced.py's ``due``
    prepared: bool = False
    q_pos: torch.Tensor | None = None  # [A, Q] on the device
    keep_t: torch.Tensor | None = None  # [K] on the device
    mask: torch.Tensor | dict | None = None  # the step's 4-D mask (a dict of them per layer kind), or None
    route: Route | None = None
    linear: str | None = None  # the route's linear kernel where it applies to this many rows
    key: TraceKey | None = None  # the trace this step would run through, where the target traces
    arena: Arena | None = None  # the cache's buffers a trace reads

    @property
    def traced_mask(self) -> torch.Tensor | None:
        """The mask a trace takes (a dict of masks is never traced)."""
        return self.mask if isinstance(self.mask, torch.Tensor) else None


class Target(Protocol):
    """What the ways read and set of the target that owns them (model/target.py's ``Target``)."""

    graphs: StepGraphs | None
    traced: TracedForward | None
    linears: FewRowLinear
    attention: GroupedAttention
    compile_seconds: float
    last_route: str

    def prepare(self, call: StepCall) -> None:
        """Derive the call's mask, route and trace key (once)."""

    def traced_step(self, call: StepCall, replay_only: bool) -> torch.Tensor | None:
        """The step through its trace, or None."""

    def forward(self, call: StepCall) -> torch.Tensor:
        """The model's own forward's kept logits."""


class StepWay(Protocol):
    """A way to run a step's forward: its logits [A, K, V], or None where it does not run this step."""

    name: str

    def run(self, call: StepCall) -> torch.Tensor | None:
        """The step's logits, or None."""


class GraphedStep:
    """One sequence's step replayed from a captured CUDA graph (the target's ``graphs``)."""

    name = "graphed"

    def __init__(self, target: Target):
        self.target = target

    def run(self, call: StepCall) -> torch.Tensor | None:
        graphs = self.target.graphs
        if graphs is None or call.slots is not None:
            return None
        arena = arena_of(call.cache)
        if arena is None or arena.buffer is None or arena.buffer.shape[2] != 1:
            return None
        logits = graphs.step(arena, call.tokens, call.positions, call.local, call.keep, call.past)
        self.target.compile_seconds = graphs.compile_seconds  # (capturing a bucket's graph: once, not the step's)
        if logits is None:
            return None
        self.target.last_route = "graph"
        return logits  # [1, K, V]


class ReplayedStep:
    """The step replayed from a trace made and checked at its shape, with the route's threads alone (the
    layers' weights and the attention are the trace's own; swapping them in would be host work for nothing)."""

    name = "replayed"

    def __init__(self, target: Target):
        self.target = target

    def run(self, call: StepCall) -> torch.Tensor | None:
        target = self.target
        target.prepare(call)
        traced = target.traced
        if call.key is None or call.arena is None or traced is None:
            return None
        count, rows = call.tokens.shape
        if not traced.serves(call.key, (count, row_class(rows))):
            return None
        with route_mode(call.route, count * rows, target.linears, weights=False):
            return target.traced_step(call, replay_only=True)


class EagerStep:
    """The model's own forward under the step's route and attention; a trace is made or checked here first
    where the step has a trace key (its run is then the step's)."""

    name = "eager"

    def __init__(self, target: Target):
        self.target = target

    def run(self, call: StepCall) -> torch.Tensor | None:
        target = self.target
        target.prepare(call)
        assert call.q_pos is not None and call.keep_t is not None, "prepared above"
        count, rows = call.tokens.shape
        with route_mode(call.route, count * rows, target.linears), \
                (target.attention.switched() if call.mask is not None else nullcontext()):
            if call.key is not None and call.arena is not None:  # (a trace made or checked here)
                logits = target.traced_step(call, replay_only=False)
                if logits is not None:
                    return logits  # [A, K, V]
            began = time.perf_counter()  # (on the CPU, where traces run, a forward has finished when it returns)
            out = target.forward(call)
            if call.key is not None and target.traced is not None:
                target.traced.ran_eagerly(call.key, time.perf_counter() - began)
        return out  # [A, K, V]
